# Convenience front end to CMake. `make demo` builds and runs the demo;
# `make test` builds and runs every test; `make install [PREFIX=/x]
# [DESTDIR=/stage]` installs (into CMake's prefix, /usr/local unless the
# build was configured otherwise, when PREFIX is not given).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all build demo test asan tsan fuzz install clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# Only the library and the demo: seconds, not the whole tree and its tests.
demo: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target demo
	./$(BUILD)/examples/demo

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DCMAKE_C_COMPILER=clang -DGPUIPC_SANITIZE=ON"

# Children forked by threaded tests exec or exit at once: die_after_fork=0.
tsan:
	TSAN_OPTIONS="exitcode=66 die_after_fork=0 suppressions=$(CURDIR)/tests/tsan.supp $(TSAN_OPTIONS)" \
	$(MAKE) test BUILD=build-tsan CMAKE_FLAGS="-DCMAKE_C_COMPILER=clang -DGPUIPC_TSAN=ON"

fuzz:
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DGPUIPC_FUZZ=ON -DBUILD_TESTING=OFF -DGPUIPC_BUILD_EXAMPLES=OFF -DGPUIPC_BUILD_TOOLS=OFF
	cmake --build build-fuzz -j $(JOBS)

install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix "$(PREFIX)")

clean:
	rm -rf build build-asan build-tsan build-fuzz build-gcc-[RD] build-clang-[RD]
