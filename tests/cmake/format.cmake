# Every C++ file follows .clang-format (`make format` applies it).
find_program(KILN_CLANG_FORMAT clang-format)
find_program(KILN_GIT git)
if(KILN_CLANG_FORMAT AND KILN_GIT AND EXISTS ${PROJECT_SOURCE_DIR}/.git)
  add_test(NAME lint.clang_format
           COMMAND sh -c "${KILN_GIT} ls-files '*.cpp' '*.h' | xargs ${KILN_CLANG_FORMAT} --dry-run -Werror"
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(lint.clang_format PROPERTIES LABELS lint TIMEOUT 300)
endif()
