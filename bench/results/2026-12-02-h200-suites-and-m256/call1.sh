#!/usr/bin/env bash
# Call 1 (binaries of cbe95ce in .devbin-m): five GPU test suites, each timed (scripts/device-suites.sh).
OUT=$OUT BUDGET_S=570 bash .devbin-m/device-suites.sh .devbin-m quant_linear cuda_linear cuda_dequantize cuda_w8a8 cuda_conv_int8
