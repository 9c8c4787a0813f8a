# kiln-tiny's data tooling (tools/tiny): cleaners and generators, Python stdlib only.
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME tools.tiny_unittest
           COMMAND ${Python3_EXECUTABLE} -B -m unittest discover -s tools/tiny
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
endif()
