# cuDNN's fused flash attention (src/backend/cuda/attention_cudnn.cu), included by the CUDA section.
# Compiled in (MT_HAVE_CUDNN=1) when cudnn.h and the cudnn-frontend headers (scripts/cudnn-frontend.sh
# puts them in third_party/cudnn-frontend/include) are found; otherwise the file compiles to stubs
# and the attention op runs our kernels. Nothing links against libcudnn: attention_cudnn.cu dlopens
# libcudnn.so.9 at run time, so a binary built here starts on machines without cuDNN.
#   MT_CUDNN: AUTO (when found) | ON (an error when not found) | OFF
#   CUDNN_INCLUDE_DIR: the folder of cudnn.h, when not beside CUDA's headers (also an environment
#   variable); the copy scripts/cudnn-frontend.sh keeps in third_party/cudnn-frontend/cudnn/include
#   is the last resort (for a cuDNN that came without headers, e.g. a Python wheel).
set(MT_CUDNN "AUTO" CACHE STRING "cuDNN flash attention: AUTO (when its headers exist) | ON | OFF")
set(MT_CUDNN_FRONTEND_INCLUDE "${CMAKE_SOURCE_DIR}/third_party/cudnn-frontend/include" CACHE PATH
    "the cudnn-frontend C++ headers (scripts/cudnn-frontend.sh)")
set(MT_HAVE_CUDNN_BUILD OFF)
set(MT_CUDNN_WHY "built with -DMT_CUDNN=OFF")
if(NOT MT_CUDNN STREQUAL "OFF")
  find_path(CUDNN_INCLUDE_DIR cudnn.h
    HINTS ENV CUDNN_INCLUDE_DIR ${CUDAToolkit_INCLUDE_DIRS}
    PATHS ${CMAKE_SOURCE_DIR}/third_party/cudnn-frontend/cudnn/include)
  if(NOT CUDNN_INCLUDE_DIR)
    set(MT_CUDNN_WHY "no cudnn.h (install cuDNN 9's headers or set CUDNN_INCLUDE_DIR)")
  elseif(NOT EXISTS "${MT_CUDNN_FRONTEND_INCLUDE}/cudnn_frontend.h")
    set(MT_CUDNN_WHY "no ${MT_CUDNN_FRONTEND_INCLUDE}/cudnn_frontend.h (run scripts/cudnn-frontend.sh)")
  else()
    set(MT_HAVE_CUDNN_BUILD ON)
  endif()
endif()
if(MT_HAVE_CUDNN_BUILD)
  set_property(SOURCE src/backend/cuda/attention_cudnn.cu APPEND PROPERTY COMPILE_DEFINITIONS MT_HAVE_CUDNN=1)
  # SYSTEM: the frontend's own warnings are not ours
  target_include_directories(mtcore SYSTEM PRIVATE ${MT_CUDNN_FRONTEND_INCLUDE} ${CUDNN_INCLUDE_DIR})
  target_link_libraries(mtcore PUBLIC ${CMAKE_DL_LIBS})
  set(MT_CUDNN_FRONTEND_VERSION "of unknown version")
  if(EXISTS "${MT_CUDNN_FRONTEND_INCLUDE}/../VERSION")
    file(STRINGS "${MT_CUDNN_FRONTEND_INCLUDE}/../VERSION" MT_CUDNN_FRONTEND_VERSION LIMIT_COUNT 1)
  endif()
  message(STATUS "cuDNN attention: on (cudnn.h in ${CUDNN_INCLUDE_DIR}, cudnn-frontend "
                 "${MT_CUDNN_FRONTEND_VERSION}; libcudnn.so.9 is loaded at run time)")
elseif(MT_CUDNN STREQUAL "ON")
  message(FATAL_ERROR "MT_CUDNN=ON but ${MT_CUDNN_WHY}")
else()
  message(STATUS "cuDNN attention: off, ${MT_CUDNN_WHY}; attention runs the built-in kernels")
endif()
