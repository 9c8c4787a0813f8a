# kiln run --dump-activations end to end (make-model'd mistral3 file; plain-Python oracle).
add_test(NAME e2e.dump_activations
         COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/dump_activations_test.sh $<TARGET_FILE:kiln>
                 ${PROJECT_SOURCE_DIR})
set_tests_properties(e2e.dump_activations PROPERTIES LABELS e2e TIMEOUT 300)
