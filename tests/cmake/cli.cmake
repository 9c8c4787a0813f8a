# kiln command end-to-end tests (shell scripts driving the built binary).
add_test(NAME e2e.inspect
         COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/inspect_test.sh $<TARGET_FILE:kiln>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.inspect PROPERTIES LABELS e2e TIMEOUT 300)
add_test(NAME e2e.text_cli
         COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/text_cli_test.sh $<TARGET_FILE:kiln>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.text_cli PROPERTIES LABELS e2e TIMEOUT 300)
# kiln serve end to end with the official openai client (node's test runner).
find_program(KILN_NODE_BIN node)
if(KILN_NODE_BIN)
  add_test(NAME e2e.serve_openai
           COMMAND ${KILN_NODE_BIN} --test ${PROJECT_SOURCE_DIR}/tests/e2e/serve_test.mjs
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(e2e.serve_openai PROPERTIES LABELS e2e TIMEOUT 600
    ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>;KILN_SHARED=${PROJECT_SOURCE_DIR}/../shared")
endif()
# Thinking through /v1/messages (@anthropic-ai/sdk) on a random Qwen3-shaped model whose
# template opens the reasoning block: thinking blocks, signatures, the thinking budget.
if(KILN_NODE_BIN)
  add_test(NAME e2e.anthropic_thinking
           COMMAND ${KILN_NODE_BIN} --test ${PROJECT_SOURCE_DIR}/tests/e2e/anthropic_thinking_test.mjs
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(e2e.anthropic_thinking PROPERTIES LABELS e2e TIMEOUT 300
    ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>")
endif()
# Serving soak: 500 random requests at concurrency 16 with client aborts, then a clean exit.
# Its point is the sanitizer build, whose ctest runs only `unit` tests: there it is labelled
# `unit` too (it takes ~30-60 s with the ASan/UBSan kiln on the tiny stories260K model).
if(KILN_NODE_BIN)
  add_test(NAME e2e.serve_soak
           COMMAND ${KILN_NODE_BIN} --test ${PROJECT_SOURCE_DIR}/tests/e2e/soak_test.mjs
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  if(KILN_SANITIZE)
    set(kiln_soak_labels "e2e;soak;unit")
  else()
    set(kiln_soak_labels "e2e;soak")
  endif()
  set_tests_properties(e2e.serve_soak PROPERTIES LABELS "${kiln_soak_labels}" TIMEOUT 600
    ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>;KILN_SHARED=${PROJECT_SOURCE_DIR}/../shared")
endif()
# Bad command-line values are usage errors naming the flag (issue 13).
add_test(NAME e2e.cli_flags
         COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/cli_flags_test.sh $<TARGET_FILE:kiln>)
set_tests_properties(e2e.cli_flags PROPERTIES LABELS e2e TIMEOUT 120)

# Two kiln processes meet over loopback (the multi-node rendezvous).
add_test(NAME e2e.rendezvous
         COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/rendezvous_test.sh $<TARGET_FILE:kiln>)
set_tests_properties(e2e.rendezvous PROPERTIES LABELS e2e TIMEOUT 120)
