# Tokenizer oracle: tokenizers.js (npm @huggingface/tokenizers) encodes the corpus in
# tests/oracle/tokenizer for each vocabulary; TokenizerOracle.* in test_tokenizer compares
# kiln's ids with 100% equality. The setup step regenerates the expectations at test time,
# so they cannot go stale.

find_program(KILN_NODE node)
if(KILN_NODE AND TARGET test_tokenizer)
  set(kiln_tok_oracle_json ${CMAKE_BINARY_DIR}/oracle/tokenizer_expected.json)
  add_test(NAME tokenizer_oracle_generate
           COMMAND ${KILN_NODE} ${PROJECT_SOURCE_DIR}/tests/oracle/tokenizer/oracle.mjs
                   --out ${kiln_tok_oracle_json}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(tokenizer_oracle_generate PROPERTIES
                       FIXTURES_SETUP tokenizer_oracle LABELS oracle)
  add_test(NAME tokenizer_oracle_compare
           COMMAND test_tokenizer --gtest_filter=TokenizerOracle.*)
  set_tests_properties(tokenizer_oracle_compare PROPERTIES
                       FIXTURES_REQUIRED tokenizer_oracle LABELS oracle
                       ENVIRONMENT KILN_TOKENIZER_ORACLE_JSON=${kiln_tok_oracle_json})
endif()
