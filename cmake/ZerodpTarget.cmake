# Warnings and sanitizers per target, not in global flags (docs/architecture.md).
set(ZERODP_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
    -Wnon-virtual-dtor -Woverloaded-virtual -Wimplicit-fallthrough)

function(zerodp_target_options target)
  target_compile_options(${target} PRIVATE ${ZERODP_WARNINGS}
    # Results must not depend on contraction choices the compiler makes per call site.
    -ffp-contract=off)
  if(ZERODP_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(ZERODP_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${ZERODP_SANITIZE} -fno-omit-frame-pointer
                                             -fno-sanitize-recover=all)
    target_link_options(${target} PRIVATE -fsanitize=${ZERODP_SANITIZE})
  endif()
endfunction()

# zerodp_library(name SOURCES ... DEPS ...)
function(zerodp_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(zerodp_${name} STATIC ${ARG_SOURCES})
  add_library(zerodp::${name} ALIAS zerodp_${name})
  target_include_directories(zerodp_${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/zerodp>)
  target_link_libraries(zerodp_${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  set_target_properties(zerodp_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON
                                                  EXPORT_NAME ${name})
  zerodp_target_options(zerodp_${name})
  set_property(GLOBAL APPEND PROPERTY ZERODP_LIBRARIES zerodp_${name})
endfunction()
