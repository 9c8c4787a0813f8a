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
