# CUDA C for the test helpers, examples and benchmarks that launch kernels
# (never for the library, which loads the driver at run time). Built when
# nvcc is found; sets GPUIPC_HAVE_NVCC. Sanitizer and fuzzer builds leave
# it out: their flags are not nvcc's.
option(GPUIPC_CUDA_PROGRAMS
  "Build the CUDA C test helpers, examples and benchmarks when nvcc is found" ON)
set(GPUIPC_HAVE_NVCC 0)
if(GPUIPC_CUDA_PROGRAMS AND GPUIPC_HAVE_CUDA AND NOT GPUIPC_SANITIZED
   AND NOT GPUIPC_FUZZ)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
     AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # A100, H100/H200 (and PTX for newer GPUs to compile at load).
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(GPUIPC_HAVE_NVCC 1)
    message(STATUS "gpuipc: nvcc ${CMAKE_CUDA_COMPILER_VERSION}: building the "
                   "CUDA C helpers, examples and benchmarks")
  else()
    message(STATUS "gpuipc: no nvcc: the CUDA C helpers, examples and "
                   "benchmarks are left out (their tests skip)")
  endif()
endif()
