/*
 * The version macros of gpuipc.h against the library: GPUIPC_VERSION_MAJOR,
 * _MINOR, _PATCH and the numeric GPUIPC_VERSION must say what
 * gpuipc_version() says, and that is CMake's project(VERSION).
 */
#include "test.h"

#define STR2(x) #x
#define STR(x) STR2(x)

int main(void)
{
  char hdr[64];
  snprintf(hdr, sizeof(hdr), "%d.%d.%d", GPUIPC_VERSION_MAJOR,
           GPUIPC_VERSION_MINOR, GPUIPC_VERSION_PATCH);
  ASSERT_STREQ(hdr, gpuipc_version());
  ASSERT_STREQ(GPUIPC_TEST_PROJECT_VERSION, gpuipc_version());
#ifndef GPUIPC_VERSION
  TFAIL("gpuipc.h defines no GPUIPC_VERSION");
#else
  ASSERT_EQ(GPUIPC_VERSION, GPUIPC_VERSION_MAJOR * 10000 +
                                GPUIPC_VERSION_MINOR * 100 +
                                GPUIPC_VERSION_PATCH);
  /* Each part fits its two decimal digits, so the number orders releases. */
  ASSERT_LT(GPUIPC_VERSION_MINOR, 100);
  ASSERT_LT(GPUIPC_VERSION_PATCH, 100);
  /* The macros are plain integer constants: usable in #if. */
#if GPUIPC_VERSION < 10000
  TFAIL("GPUIPC_VERSION %d is below 1.0.0", GPUIPC_VERSION);
#endif
#endif
  printf("gpuipc %s, GPUIPC_VERSION %s\n", gpuipc_version(),
         STR(GPUIPC_VERSION));
  return 0;
}
