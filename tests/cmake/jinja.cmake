# Jinja oracle: Python's Jinja2 (configured like Hugging Face's apply_chat_template) renders
# the real chat templates of ../shared/templates and the npm tokenizer packages over
# tests/oracle/jinja/conversations; test_chat's JinjaOracle test renders the same with kiln
# and compares byte for byte.
find_program(KILN_PYTHON3 NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(NOT KILN_PYTHON3)
  find_program(KILN_PYTHON3 python3)
endif()
if(KILN_PYTHON3 AND TARGET test_chat)
  set(jinja_oracle_dir ${PROJECT_BINARY_DIR}/jinja_oracle)
  add_test(NAME jinja_oracle_render
           COMMAND ${KILN_PYTHON3} ${PROJECT_SOURCE_DIR}/tests/oracle/jinja/render.py
                   ${jinja_oracle_dir} ${PROJECT_SOURCE_DIR})
  set_tests_properties(jinja_oracle_render PROPERTIES FIXTURES_SETUP jinja_oracle LABELS oracle)
  add_test(NAME jinja_oracle_compare
           COMMAND test_chat --gtest_filter=JinjaOracle.*)
  set_tests_properties(jinja_oracle_compare PROPERTIES
    FIXTURES_REQUIRED jinja_oracle
    ENVIRONMENT KILN_JINJA_ORACLE_DIR=${jinja_oracle_dir}
    LABELS oracle
    # A skip (no expectations) must not pass silently here.
    FAIL_REGULAR_EXPRESSION "SKIPPED")
endif()
