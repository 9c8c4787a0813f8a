# kiln command end-to-end tests (shell scripts driving the built binary).
add_test(NAME e2e.inspect
         COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/inspect_test.sh $<TARGET_FILE:kiln>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.inspect PROPERTIES LABELS e2e TIMEOUT 300)
add_test(NAME e2e.text_cli
         COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/text_cli_test.sh $<TARGET_FILE:kiln>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.text_cli PROPERTIES LABELS e2e TIMEOUT 300)
