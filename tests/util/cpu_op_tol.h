/* The tolerances of the fp32 CPU ops against their double-precision references (the
 * tests/test_ops_cpu*.c family): |got - ref| <= atol + rtol * |ref| for outputs (FWD: one fp32
 * evaluation) and for gradients (BWD: longer fp32 sums, and central differences of step FD_H where
 * the reference is numerical). One setting for the family; a test's own bounds stay in the test. */
#ifndef MT_TEST_CPU_OP_TOL_H
#define MT_TEST_CPU_OP_TOL_H

#define FWD_ATOL 1e-6
#define FWD_RTOL 1e-5
#define BWD_ATOL 1e-5
#define BWD_RTOL 1e-4
#define FD_H 1e-4

#endif
