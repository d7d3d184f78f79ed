# Finds Torch and decides the CUDA build. Sets:
#   SHARDWISE_TORCH_LIBRARIES   what to link (TORCH_LIBRARIES without entries torch could not
#                               find, e.g. nvrtc, which the CUDA wheels keep outside the toolkit)
#   SHARDWISE_CUDA              whether the CUDA kernels and NCCL are built
#   SHARDWISE_NCCL_INCLUDE_DIR, SHARDWISE_NCCL_LIBRARY   (with CUDA)
#   SHARDWISE_INSTALL_RPATH     torch's (and NCCL's) library folders
# A CUDA torch makes find_package(Torch) enable CUDA itself; the architectures default to
# sm_80 and sm_90 (+PTX) unless TORCH_CUDA_ARCH_LIST says otherwise (as setup.py did).
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0+PTX")
endif()
find_package(Torch REQUIRED)
if(Torch_VERSION VERSION_LESS SHARDWISE_MIN_TORCH_VERSION)
  message(FATAL_ERROR "shardwise needs LibTorch ${SHARDWISE_MIN_TORCH_VERSION} or newer; "
                      "found ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}. Put a newer torch on "
                      "CMAKE_PREFIX_PATH (pip install 'torch>=${SHARDWISE_MIN_TORCH_VERSION}').")
endif()
set(SHARDWISE_TORCH_LIBRARIES ${TORCH_LIBRARIES})
list(FILTER SHARDWISE_TORCH_LIBRARIES EXCLUDE REGEX "-NOTFOUND$")
set(SHARDWISE_INSTALL_RPATH "${TORCH_INSTALL_PREFIX}/lib")

set(_torch_has_cuda OFF)
if(TARGET torch_cuda)
  set(_torch_has_cuda ON)
endif()
string(TOUPPER "${SHARDWISE_WITH_CUDA}" _with_cuda)
if(_with_cuda STREQUAL "AUTO")
  set(SHARDWISE_CUDA ${_torch_has_cuda})
elseif(_with_cuda)
  if(NOT _torch_has_cuda)
    message(FATAL_ERROR "SHARDWISE_WITH_CUDA=ON but the torch found at ${TORCH_INSTALL_PREFIX} "
                        "has no CUDA: point CMAKE_PREFIX_PATH at a CUDA build of torch, or "
                        "configure with -DSHARDWISE_WITH_CUDA=OFF")
  endif()
  set(SHARDWISE_CUDA ON)
else()
  set(SHARDWISE_CUDA OFF)
endif()

if(SHARDWISE_CUDA)
  # NCCL: torch's CUDA wheels bring nvidia-nccl beside torch; else beside the CUDA toolkit.
  get_filename_component(_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  find_path(SHARDWISE_NCCL_INCLUDE_DIR nccl.h
            HINTS ${NCCL_ROOT}/include ${_site}/nvidia/nccl/include ${CUDAToolkit_INCLUDE_DIRS})
  find_library(SHARDWISE_NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS ${NCCL_ROOT}/lib ${_site}/nvidia/nccl/lib ${CUDAToolkit_LIBRARY_DIR})
  if(NOT SHARDWISE_NCCL_INCLUDE_DIR OR NOT SHARDWISE_NCCL_LIBRARY)
    message(FATAL_ERROR "building with CUDA needs NCCL: install torch's CUDA wheel (it brings "
                        "nvidia-nccl), set NCCL_ROOT, or configure with -DSHARDWISE_WITH_CUDA=OFF")
  endif()
  get_filename_component(_nccl_dir "${SHARDWISE_NCCL_LIBRARY}" DIRECTORY)
  list(APPEND SHARDWISE_INSTALL_RPATH "${_nccl_dir}")
  message(STATUS "shardwise: CUDA kernels and NCCL (${SHARDWISE_NCCL_LIBRARY})")
else()
  message(STATUS "shardwise: CPU only")
endif()
