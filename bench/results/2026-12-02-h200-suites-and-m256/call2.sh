#!/usr/bin/env bash
# Call 2 (binaries of cbe95ce in .devbin-m, the machine of call 1 still warm): the other two GPU test suites.
OUT=$OUT BUDGET_S=585 bash .devbin-m/device-suites.sh .devbin-m cuda_conv cuda_linear_gemm
