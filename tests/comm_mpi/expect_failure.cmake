# Runs `MPIEXEC NP_FLAG NP PROGRAM MODE` and passes only if the job exits non-zero and its
# output matches the regular expression EXPECT: a job meant to fail must fail, and say why.
execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} ${NP} ${PROGRAM} ${MODE}
                RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output
                TIMEOUT 100)
message("${output}")
if(result EQUAL 0)
  message(FATAL_ERROR "the job was meant to fail but exited 0")
endif()
if(NOT output MATCHES "${EXPECT}")
  message(FATAL_ERROR "the job failed (${result}) but its output does not match '${EXPECT}'")
endif()
message("the job failed as expected (${result}) and its output matches '${EXPECT}'")
