# kiln-tiny, the bundled model (models/kiln-tiny.gguf): its held-out perplexity in kiln
# against the training script's, and `kiln serve` with no -m answering definitions and
# calling the dictionary tool through the openai client (chat, responses and its WebSocket mode)
# and the Anthropic SDK; /v1/embeddings through the openai client.
if(EXISTS ${PROJECT_SOURCE_DIR}/models/kiln-tiny.gguf)
  find_program(KILN_TINY_PYTHON3 python3)
  if(KILN_TINY_PYTHON3)
    add_test(NAME e2e.tiny_perplexity
             COMMAND ${PROJECT_SOURCE_DIR}/tests/e2e/tiny_perplexity_test.sh $<TARGET_FILE:kiln>
                     ${PROJECT_SOURCE_DIR})
    set_tests_properties(e2e.tiny_perplexity PROPERTIES LABELS e2e TIMEOUT 300)
  endif()
  find_program(KILN_TINY_NODE node)
  if(KILN_TINY_NODE)
    add_test(NAME e2e.tiny_serve
             COMMAND ${KILN_TINY_NODE} --test ${PROJECT_SOURCE_DIR}/tests/e2e/tiny_serve_test.mjs
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(e2e.tiny_serve PROPERTIES LABELS e2e TIMEOUT 300
      ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>")
    # /v1/messages through the official @anthropic-ai/sdk client (issue 14).
    add_test(NAME e2e.anthropic
             COMMAND ${KILN_TINY_NODE} --test ${PROJECT_SOURCE_DIR}/tests/e2e/anthropic_test.mjs
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(e2e.anthropic PROPERTIES LABELS e2e TIMEOUT 300
      ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>")
    # /v1/responses through the official openai client (issue 14).
    add_test(NAME e2e.responses
             COMMAND ${KILN_TINY_NODE} --test ${PROJECT_SOURCE_DIR}/tests/e2e/responses_test.mjs
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(e2e.responses PROPERTIES LABELS e2e TIMEOUT 300
      ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>")
    # /v1/embeddings through the official openai client, kiln-tiny pooled with --pooling last
    # (issue 14).
    add_test(NAME e2e.embeddings
             COMMAND ${KILN_TINY_NODE} --test ${PROJECT_SOURCE_DIR}/tests/e2e/embeddings_test.mjs
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(e2e.embeddings PROPERTIES LABELS e2e TIMEOUT 300
      ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>")
    # The WebSocket mode of /v1/responses: the openai package's Responses WebSocket client
    # over node's built-in WebSocket (experimental in node 20, hence the flag).
    add_test(NAME e2e.responses_websocket
             COMMAND ${KILN_TINY_NODE} --experimental-websocket --test
                     ${PROJECT_SOURCE_DIR}/tests/e2e/responses_websocket_test.mjs
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(e2e.responses_websocket PROPERTIES LABELS e2e TIMEOUT 300
      ENVIRONMENT "KILN_BIN=$<TARGET_FILE:kiln>")
  endif()
endif()
