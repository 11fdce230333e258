# Fake CUDA drivers: shared libraries that gpuipc dlopen()s through
# GPUIPC_CUDA_LIB, so that the loader, the device table and `gpuipc info`
# are tested without a GPU (tests/driver.c, tests/helpers/driver_probe.c).
# Included from tests/CMakeLists.txt after the test targets exist.
set(GPUIPC_FAKE_CUDA_DIR ${CMAKE_CURRENT_BINARY_DIR}/fake_cuda)

# gpuipc_test_on_fake(NAME [DL] [HELPERS helper...]): tests/NAME.c loads
# the fake (FAKE_CUDA_FULL names it), built before it with the helpers it
# starts; DL: it looks inside the fake with dlopen/dlsym.
function(gpuipc_test_on_fake name)
  cmake_parse_arguments(F "DL" "" "HELPERS" ${ARGN})
  add_dependencies(test_${name} fake_cuda_full ${F_HELPERS})
  target_compile_definitions(test_${name} PRIVATE
    FAKE_CUDA_FULL="$<TARGET_FILE:fake_cuda_full>")
  if(F_DL)
    target_link_libraries(test_${name} PRIVATE ${CMAKE_DL_LIBS})
  endif()
endfunction()
if(GPUIPC_HAVE_CUDA)
  foreach(variant full v1 nogpa)
    add_library(fake_cuda_${variant} SHARED
      ${CMAKE_CURRENT_LIST_DIR}/fake_cuda.c ${CMAKE_CURRENT_LIST_DIR}/fake_mem.c
      ${CMAKE_CURRENT_LIST_DIR}/fake_stream.c
      ${CMAKE_CURRENT_LIST_DIR}/fake_kernel.c)
    target_include_directories(fake_cuda_${variant} SYSTEM PRIVATE
      ${GPUIPC_CUDA_INCLUDE_DIR})
    target_compile_options(fake_cuda_${variant} PRIVATE ${GPUIPC_WARNINGS})
    target_link_libraries(fake_cuda_${variant} PRIVATE Threads::Threads)
    set_target_properties(fake_cuda_${variant} PROPERTIES
      C_VISIBILITY_PRESET default
      LIBRARY_OUTPUT_DIRECTORY ${GPUIPC_FAKE_CUDA_DIR})
  endforeach()
  target_compile_definitions(fake_cuda_v1 PRIVATE FAKE_CUDA_GPA_V1)
  target_compile_definitions(fake_cuda_nogpa PRIVATE FAKE_CUDA_NO_GPA)
  add_dependencies(test_driver fake_cuda_full fake_cuda_v1 fake_cuda_nogpa)
  target_compile_definitions(test_driver PRIVATE
    FAKE_CUDA_FULL="$<TARGET_FILE:fake_cuda_full>"
    FAKE_CUDA_V1="$<TARGET_FILE:fake_cuda_v1>"
    FAKE_CUDA_NOGPA="$<TARGET_FILE:fake_cuda_nogpa>")
  # The probe looks inside the fake (retain counts) with dlopen/dlsym.
  target_link_libraries(driver_probe PRIVATE ${CMAKE_DL_LIBS})
  # tests/channel_streams.c: two chan_stream_peer processes on the fake,
  # which count its records and waits.
  gpuipc_test_on_fake(channel_streams HELPERS chan_stream_peer)
  target_link_libraries(chan_stream_peer PRIVATE ${CMAKE_DL_LIBS})
  # tests/channel_wait_across.c: chan_away_peer pairs count the sender's
  # waits on release words written on another GPU and on its own.
  gpuipc_test_on_fake(channel_wait_across HELPERS chan_away_peer)
  target_link_libraries(chan_away_peer PRIVATE ${CMAKE_DL_LIBS})
  # tests/channel_ready_guard.c: a sender killed before its ready word.
  gpuipc_test_on_fake(channel_ready_guard HELPERS chan_guard_peer)
  # tests/channel_blocks.c: block batches on the fake's device 0, which
  # counts the batched copies.
  gpuipc_test_on_fake(channel_blocks HELPERS chan_blocks_peer)
  target_link_libraries(chan_blocks_peer PRIVATE ${CMAKE_DL_LIBS})
  # tests/channel_gpu_order.c: tests/channel_gpu.c's scenarios on the fake.
  gpuipc_test_on_fake(channel_gpu_order HELPERS chan_order_peer)
  target_link_libraries(chan_order_peer PRIVATE ${CMAKE_DL_LIBS})
  # tests/channel_hold_gpu.c: a held view on device 0 of the fake.
  gpuipc_test_on_fake(channel_hold_gpu HELPERS chan_hold_peer)
  target_link_libraries(chan_hold_peer PRIVATE ${CMAKE_DL_LIBS})
  # tests/channel_copy_kernel.c: the receive copy as gpuipc's kernel or
  # the copy engine's, which both ends count in the fake.
  gpuipc_test_on_fake(channel_copy_kernel
    HELPERS chan_order_peer chan_kernel_peer)
  target_link_libraries(chan_kernel_peer PRIVATE ${CMAKE_DL_LIBS})
  # tests/channel_close_events.c: closes while the other end's use of
  # the events is still to come.
  gpuipc_test_on_fake(channel_close_events HELPERS chan_close_peer)
  target_link_libraries(chan_close_peer PRIVATE ${CMAKE_DL_LIBS})
  # tests/host_pin.c: HOST registration, looked at in the fake, in this
  # process and in chan_peer / chan_order_peer pairs.
  gpuipc_test_on_fake(host_pin DL HELPERS chan_peer chan_order_peer)
  # tests/broker_republish_liar.c: a LEGACY segment of seg_peers on the
  # fake, and a liar's own LEGACY memory.
  gpuipc_test_on_fake(broker_republish_liar HELPERS seg_peer)
endif()
add_dependencies(test_driver driver_probe)
# `gpuipc info` is checked against the fake driver and without one.
if(TARGET gpuipc_cli)
  add_dependencies(test_driver gpuipc_cli)
  target_compile_definitions(test_driver PRIVATE
    GPUIPC_CLI="$<TARGET_FILE:gpuipc_cli>")
endif()
