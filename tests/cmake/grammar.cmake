# Grammar soundness oracle: test_grammar's random walks through the token masks write their
# outputs; Debian's python3-jsonschema validates them against the suite's schemas.
find_program(KILN_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT KILN_PYTHON3)
  find_program(KILN_PYTHON3 python3)
endif()
if(KILN_PYTHON3 AND TARGET test_grammar)
  set(grammar_soundness_dir ${PROJECT_BINARY_DIR}/grammar_soundness)
  add_test(NAME grammar_soundness_generate
           COMMAND ${CMAKE_COMMAND} -E env KILN_GRAMMAR_SOUNDNESS_DIR=${grammar_soundness_dir}
                   $<TARGET_FILE:test_grammar> --gtest_filter=*SoundnessRandomWalksValidate*)
  set_tests_properties(grammar_soundness_generate PROPERTIES FIXTURES_SETUP grammar_soundness
                       LABELS oracle)
  add_test(NAME grammar_soundness_validate
           COMMAND ${KILN_PYTHON3} ${PROJECT_SOURCE_DIR}/tests/oracle/grammar/validate.py
                   ${grammar_soundness_dir} ${PROJECT_SOURCE_DIR})
  set_tests_properties(grammar_soundness_validate PROPERTIES FIXTURES_REQUIRED grammar_soundness
                       LABELS oracle)
endif()

# Structured output through a live server and the openai client (kiln-tiny and stories260K).
find_program(KILN_GRAMMAR_NODE node)
if(KILN_GRAMMAR_NODE AND EXISTS ${PROJECT_SOURCE_DIR}/models/kiln-tiny.gguf)
  add_test(NAME e2e.grammar_serve
           COMMAND ${KILN_GRAMMAR_NODE} --test ${PROJECT_SOURCE_DIR}/tests/e2e/grammar_serve_test.mjs
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(e2e.grammar_serve PROPERTIES LABELS e2e TIMEOUT 300
    ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>;KILN_SHARED=${PROJECT_SOURCE_DIR}/../shared")
endif()

# kiln run --grammar / --json-schema.
if(EXISTS ${PROJECT_SOURCE_DIR}/../shared/models/stories260K.gguf)
  add_test(NAME e2e.grammar_run
           COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/grammar_run_test.sh $<TARGET_FILE:kiln>
                   ${PROJECT_SOURCE_DIR}/../shared)
  set_tests_properties(e2e.grammar_run PROPERTIES LABELS e2e TIMEOUT 120)
endif()
