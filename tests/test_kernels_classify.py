"""Kernel/operator categories and short display names."""

from __future__ import annotations

import pytest

from flowtop.monitor.kernels.classify import CATEGORIES, classify, short_name, signature_head

# Names as they appear on H200 (the reference step fixture, docs/design.md) and in other common traces.
KERNELS = [
    ("nvjet_sm90_tst_64x48_64x15_2x4_h_bz_NNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(Params)", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>(cublasLt::cublasSplitKParams<float>)", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0", "attention"),
    ("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*)", "attention"),
    ("void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*)", "attention"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t> >(Flash_fwd_params)", "attention"),
    ("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits>(Flash_bwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel::Params)", "attention"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", "communication"),
    ("Memcpy HtoD (Pageable -> Device)", "memory"),
    ("Memset (Device)", "memory"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4> >"
     "(at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>)", "optimizer"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float)", "norm_softmax"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u>(long)", "norm_softmax"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForwardReg<float, float, float>(float*, float const*, long)", "norm_softmax"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
     "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)", "elementwise"),
    ("triton_poi_fused_add_mul_0", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
     "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}> > >"
     "(at::native::ReduceOp<float>)", "reduction"),
    ("triton_red_fused_sum_1", "reduction"),
    ("some_custom_kernel", "other"),
]

OPERATORS = [
    ("aten::mm", "gemm"), ("aten::addmm", "gemm"), ("aten::bmm", "gemm"), ("aten::linear", "gemm"),
    ("aten::convolution_backward", "gemm"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::_scaled_dot_product_cudnn_attention_backward", "attention"),
    ("aten::layer_norm", "norm_softmax"), ("aten::native_layer_norm_backward", "norm_softmax"),
    ("aten::_softmax", "norm_softmax"), ("aten::_log_softmax_backward_data", "norm_softmax"),
    ("aten::sum", "reduction"), ("aten::nll_loss_forward", "reduction"),
    ("aten::add_", "elementwise"), ("aten::gelu_backward", "elementwise"), ("aten::copy_", "elementwise"),
    ("aten::_foreach_mul_", "optimizer"), ("aten::_fused_adamw_", "optimizer"),
    ("c10d::allreduce_", "communication"), ("nccl:all_reduce", "communication"),
    ("aten::view", "other"), ("aten::empty_strided", "other"),
    # autograd wrappers are bookkeeping whatever their name says
    ("NativeLayerNormBackward0", "other"), ("ScaledDotProductCudnnAttentionBackward0", "other"),
    ("autograd::engine::evaluate_function: LogSoftmaxBackward0", "other"),
    ("torch::autograd::AccumulateGrad", "other"),
]


@pytest.mark.parametrize(("name", "category"), KERNELS + OPERATORS)
def test_classify(name: str, category: str) -> None:
    assert classify(name) == category
    assert category in CATEGORIES


def test_argument_lists_do_not_decide_the_category() -> None:
    # "reduce" and "attention" appear only in the arguments: the head decides.
    assert classify("void my_copy_kernel<float>(ReduceParams attention_scratch)") == "elementwise"


@pytest.mark.parametrize(("name", "short"), [
    ("nvjet_sm90_tst_64x48_64x15_2x4_h_bz_NNT", "nvjet_sm90_tst_64x48_64x15_2x4_h_bz_NNT"),
    ("aten::mm", "aten::mm"),
    ("autograd::engine::evaluate_function: MmBackward0", "autograd::engine::evaluate_function: MmBackward0"),
    ("Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pageable -> Device)"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float)",
     "vectorized_layer_norm_kernel"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int>(cublasLt::cublasSplitKParams<float>, float const*)",
     "splitKreduce_kernel"),
    (KERNELS[15][0], "multi_tensor_apply_kernel<FusedAdamMathFunctor>"),
    (KERNELS[19][0], "vectorized_elementwise_kernel<CUDAFunctor_add>"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda()#3}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, 4>(int)",
     "unrolled_elementwise_kernel<direct_copy_kernel_cuda>"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
     "direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}> >(int)",
     "elementwise_kernel<direct_copy_kernel_cuda>"),
])
def test_short_name(name: str, short: str) -> None:
    assert short_name(name) == short


def test_signature_head_keeps_templates_and_drops_arguments() -> None:
    assert signature_head("void ns::k<a(b), 2>(int, float)") == "ns::k<a(b), 2>"
