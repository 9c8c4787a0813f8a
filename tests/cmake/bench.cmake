# kiln bench and kiln bench http end to end (node's test runner): bench's JSON and table on
# stories260K; bench http against fake servers (one closing after every response, as
# llama-server does; one failing with each cause); make-model --config against kiln convert.
find_program(KILN_BENCH_NODE node)
if(KILN_BENCH_NODE)
  add_test(NAME e2e.bench
           COMMAND ${KILN_BENCH_NODE} --test ${PROJECT_SOURCE_DIR}/tests/e2e/bench_test.mjs
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(e2e.bench PROPERTIES LABELS e2e TIMEOUT 300
    ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>;KILN_SHARED=${PROJECT_SOURCE_DIR}/../shared")
  add_test(NAME e2e.bench_http
           COMMAND ${KILN_BENCH_NODE} --test ${PROJECT_SOURCE_DIR}/tests/e2e/bench_http_test.mjs
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(e2e.bench_http PROPERTIES LABELS e2e TIMEOUT 300
    ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>")
  add_test(NAME e2e.make_model_config
           COMMAND ${KILN_BENCH_NODE} --test ${PROJECT_SOURCE_DIR}/tests/e2e/make_model_config_test.mjs
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(e2e.make_model_config PROPERTIES LABELS e2e TIMEOUT 600
    ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>")
endif()
