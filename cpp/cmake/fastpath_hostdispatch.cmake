# How a host-dispatch extension is built, for fastpath's own binding and for every generated
# package (through fastpathConfig.cmake): the fastpath::hostdispatch target (headers, threads,
# CUDA) and fastpath_add_hostdispatch_module(). Expects fastpath_INCLUDE_DIR, and pybind11 found.

# AUTO: use CUDA when the toolkit is found. The extension links the CUDA runtime statically and
# resolves driver calls at run time, so it imports on a machine without a driver.
set(FASTPATH_CUDA "AUTO" CACHE STRING "Build host dispatch with CUDA: AUTO, ON or OFF")
set_property(CACHE FASTPATH_CUDA PROPERTY STRINGS AUTO ON OFF)

find_package(Threads REQUIRED)  # the spin dispatch runs a host worker thread
set(FASTPATH_WITH_CUDA OFF)
if(NOT FASTPATH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(FASTPATH_WITH_CUDA ON)
  elseif(FASTPATH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FASTPATH_CUDA=ON but no CUDA toolkit was found")
  endif()
endif()
message(STATUS "fastpath: host dispatch with CUDA: ${FASTPATH_WITH_CUDA} (headers in ${fastpath_INCLUDE_DIR})")

if(NOT TARGET fastpath::hostdispatch)
  add_library(fastpath::hostdispatch INTERFACE IMPORTED)
  target_include_directories(fastpath::hostdispatch INTERFACE "${fastpath_INCLUDE_DIR}")
  target_link_libraries(fastpath::hostdispatch INTERFACE Threads::Threads)
  target_compile_features(fastpath::hostdispatch INTERFACE cxx_std_17)
  if(FASTPATH_WITH_CUDA)
    target_compile_definitions(fastpath::hostdispatch INTERFACE FASTPATH_WITH_CUDA=1)
    target_link_libraries(fastpath::hostdispatch INTERFACE CUDA::cudart_static)
  endif()
endif()

# fastpath_add_hostdispatch_module(<target> <source>...): a pybind11 module on fastpath's headers.
function(fastpath_add_hostdispatch_module target)
  pybind11_add_module(${target} ${ARGN})
  target_link_libraries(${target} PRIVATE fastpath::hostdispatch)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra)
  endif()
endfunction()
