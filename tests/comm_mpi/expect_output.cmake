# Runs `MPIEXEC NP_FLAG NP PROGRAM MODE` and passes only if the job's exit status is zero
# (EXIT=zero) or not (EXIT=nonzero), its output matches EXPECT (where given) and does not
# match REJECT (where given).
execute_process(COMMAND ${MPIEXEC} ${NP_FLAG} ${NP} ${PROGRAM} ${MODE}
                RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output
                TIMEOUT 100)
message("${output}")
if(EXIT STREQUAL "zero" AND NOT result EQUAL 0)
  message(FATAL_ERROR "the job was meant to end normally but exited ${result}")
endif()
if(EXIT STREQUAL "nonzero" AND result EQUAL 0)
  message(FATAL_ERROR "the job was meant to fail but exited 0")
endif()
if(DEFINED EXPECT AND NOT output MATCHES "${EXPECT}")
  message(FATAL_ERROR "the job's output (exit ${result}) does not match '${EXPECT}'")
endif()
if(DEFINED REJECT AND output MATCHES "${REJECT}")
  message(FATAL_ERROR "the job's output (exit ${result}) matches '${REJECT}'")
endif()
message("the job exited ${result} and its output is as expected")
