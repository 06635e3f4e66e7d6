#!/usr/bin/env bash
# Call 1 (binaries of 12e223d in .devbin-s): racecheck over one or more tests of every GPU suite, six at a time.
OUT=$OUT TOOLS=racecheck PAR=6 PER_S=300 BUDGET_S=530 bash scripts/device-sanitize.sh .devbin-s \
  cuda_linear_gemm:k_split_tile_of_128_tokens cuda_linear_gemm:exact_integers_bit_equal_with_and_without_split_k \
  cuda_linear_gemm:stream_k_splits_tiles_between_ctas cuda_linear_gemm:split_tiles_in_several_cluster_groups \
  cuda_linear:cluster_split_k cuda_linear:exact_integer_mode_is_bit_exact cuda_conv:hopper_path_matches_reference \
  cuda_w8a8:exact_integer_mode_is_bit_exact cuda_dequantize:kernel_variants_match_cpu \
  cuda_conv_int8:equals_the_cpu_kernel_bit_for_bit cuda_linear:gathered_tiles \
  cuda_linear_gemm:tiny_batches_on_the_16_token_tile
