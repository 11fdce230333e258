# Builds gpuipc as Debian packages it (a multiarch libdir,
# lib/x86_64-linux-gnu), installs it into a scratch prefix, then builds and
# runs programs against it through find_package(gpuipc) (gpuipc::gpuipc,
# and gpuipc::gpuipc_mpi when MPI is built) and through pkg-config
# (gpuipc.pc, gpuipc_mpi.pc).
# -D: TOP (gpuipc's source), SRC (this folder), WORK (scratch), CC,
# BUILD_TYPE, MPI (ON when the build under test has libgpuipc_mpi).
# ${WORK}/build is kept between runs, so that a rerun only rebuilds what
# changed.
set(libdir lib/x86_64-linux-gnu)
set(prefix ${WORK}/prefix)
set(build ${WORK}/build)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
    ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}")
  endif()
endfunction()

run("configure gpuipc with a multiarch libdir"
  ${CMAKE_COMMAND} -S ${TOP} -B ${build} -DCMAKE_C_COMPILER=${CC}
  -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_INSTALL_LIBDIR=${libdir}
  -DBUILD_TESTING=OFF -DGPUIPC_BUILD_EXAMPLES=OFF -DGPUIPC_BUILD_TOOLS=OFF
  -DGPUIPC_CUDA_PROGRAMS=OFF)
set(targets gpuipc gpuipc_static)
if(MPI)
  list(APPEND targets gpuipc_mpi)
endif()
run("build gpuipc" ${CMAKE_COMMAND} --build ${build} -j2 --target ${targets})
file(REMOVE_RECURSE ${prefix} ${WORK}/consumer)
run("cmake --install" ${CMAKE_COMMAND} --install ${build} --prefix ${prefix})
foreach(f ${libdir}/libgpuipc.so ${libdir}/pkgconfig/gpuipc.pc
    ${libdir}/cmake/gpuipc/gpuipcConfig.cmake include/gpuipc.h)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "not installed: ${prefix}/${f}")
  endif()
endforeach()

# find_package(gpuipc)
set(progs c)
if(MPI)
  list(APPEND progs cm)
endif()
run("configure the find_package(gpuipc) consumer"
  ${CMAKE_COMMAND} -S ${SRC} -B ${WORK}/consumer -DCMAKE_PREFIX_PATH=${prefix}
  -DCMAKE_C_COMPILER=${CC} -DWITH_MPI=${MPI})
run("build the find_package(gpuipc) consumer"
  ${CMAKE_COMMAND} --build ${WORK}/consumer)
foreach(p ${progs})
  run("${p} built through find_package(gpuipc)" ${WORK}/consumer/${p})
endforeach()

# pkg-config
find_program(PKG_CONFIG pkg-config)
if(NOT PKG_CONFIG)
  message(STATUS "pkg-config not installed: that half left out")
  return()
endif()
set(ENV{PKG_CONFIG_PATH} ${prefix}/${libdir}/pkgconfig)
set(pkgs gpuipc)
set(srcs main.c)
if(MPI)
  list(APPEND pkgs gpuipc_mpi)
  list(APPEND srcs main_mpi.c)
endif()
foreach(pkg src IN ZIP_LISTS pkgs srcs)
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs ${pkg}
    OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config does not know ${pkg}: ${err}")
  endif()
  message(STATUS "pkg-config --cflags --libs ${pkg}: ${flags}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  run("${src} built through pkg-config ${pkg}" ${CC} ${SRC}/${src} ${flags}
    -Wl,-rpath,${prefix}/${libdir} -o ${WORK}/${pkg}_pc)
  run("${src} built through pkg-config ${pkg}, run" ${WORK}/${pkg}_pc)
endforeach()

# Man pages: gpuipc(1), gpuipc(7), and a section 3 entry for every
# GPUIPC_API function of the installed header, which is its object's page or
# a ".so" line leading to a page, installed too, that names the function.
set(man ${prefix}/${MANDIR})
foreach(page man1/gpuipc.1 man7/gpuipc.7)
  if(NOT EXISTS ${man}/${page})
    message(FATAL_ERROR "man page not installed: ${MANDIR}/${page}")
  endif()
endforeach()
file(READ ${prefix}/include/gpuipc.h hdr)
string(REGEX MATCHALL "GPUIPC_API[^(;]*[ *]gpuipc_[a-z0-9_]+\\(" decls "${hdr}")
set(nman 0)
foreach(d ${decls})
  string(REGEX MATCH "gpuipc_[a-z0-9_]+\\(" fn "${d}")
  string(REPLACE "(" "" fn "${fn}")
  set(entry ${man}/man3/${fn}.3)
  if(NOT EXISTS ${entry})
    message(FATAL_ERROR "${fn}: no man page installed (${MANDIR}/man3/${fn}.3)")
  endif()
  file(READ ${entry} text)
  if(text MATCHES "^\\.so ([^\n]+)")
    set(entry ${man}/${CMAKE_MATCH_1})
    if(NOT EXISTS ${entry})
      message(FATAL_ERROR "${fn}.3 leads to ${CMAKE_MATCH_1}, not installed")
    endif()
    file(READ ${entry} text)
  endif()
  if(NOT text MATCHES "${fn}[^a-z0-9_]")
    message(FATAL_ERROR "${fn}: its man page ${entry} does not name it")
  endif()
  math(EXPR nman "${nman} + 1")
endforeach()
message(STATUS "man pages installed for ${nman} functions")
