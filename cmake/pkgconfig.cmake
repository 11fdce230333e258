# gpuipc_pkg_config(NAME): configure cmake/NAME.pc.in into the build tree and
# install it in LIBDIR/pkgconfig. The .pc file finds its prefix from where it
# lies (${pcfiledir}), going up as many levels as CMAKE_INSTALL_LIBDIR has
# plus one (lib, lib64 and Debian's lib/x86_64-linux-gnu alike), so that an
# install moved with `cmake --install --prefix` stays right. An absolute
# LIBDIR or INCLUDEDIR is written as it is.
# The caller's variables are visible to the .pc.in (@ONLY substitution).
function(gpuipc_pkg_config name)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set(GPUIPC_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
    set(GPUIPC_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
  else()
    file(RELATIVE_PATH up "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
    string(REGEX REPLACE "/$" "" up "${up}")
    set(GPUIPC_PC_PREFIX "\${pcfiledir}/${up}")
    set(GPUIPC_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  endif()
  if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
    set(GPUIPC_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
  else()
    set(GPUIPC_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${name}.pc.in
    ${PROJECT_BINARY_DIR}/${name}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${name}.pc
    DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()
