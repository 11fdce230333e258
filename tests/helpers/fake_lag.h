/*
 * The beginning of a test of GPU ordering on the fake CUDA driver
 * (tests/fake_cuda/): every process it starts loads the fake, whose queued
 * copies stay pending until a synchronisation or another process's wait
 * (FAKE_CUDA_COPY_LAG so large that no query completes them). Skipped in
 * a build without the CUDA headers (no fake driver, FAKE_CUDA_FULL unset).
 */
#ifndef GPUIPC_TEST_FAKE_LAG_H
#define GPUIPC_TEST_FAKE_LAG_H

#include "test.h"

#include <stdio.h>
#include <stdlib.h>

/* Set the fake up for this process and its children; join @domain. */
static inline gpuipc_domain_t *fake_lag_begin(const char *domain)
{
  setvbuf(stdout, NULL, _IONBF, 0);
#ifndef FAKE_CUDA_FULL
  (void)domain;
  SKIP("built without the CUDA headers: no fake CUDA driver");
  return NULL;
#else
  setenv("GPUIPC_CUDA_LIB", FAKE_CUDA_FULL, 1);
  setenv("FAKE_CUDA_COPY_LAG", "1000000000", 1);
  gpuipc_domain_t *dom;
  ASSERT_OK(gpuipc_domain_join(domain, NULL, &dom));
  return dom;
#endif
}

#endif
