// The host side of one es_spmm_kernel launch in C++: allocate the output, fill the kernel's parameters and
// call cuLaunchKernel, in one call from Python (kernels/cpp_launch.py builds this file with
// torch.utils.cpp_extension; kernels/spmm_cuda.py keeps one Launch per prepared launch and kernel instance).
//
// Python's path for the same work (spmm_cuda._plan_of + spmm_cuda.launch) is its specification: the same
// 18 parameters in the same 8-byte slots (an int parameter reads the low 4 bytes of its slot, which is its
// value on a little-endian host), the output of the same type, zeroed when rows are split. What it saves is
// the Python around torch.empty and CuPy's launch binding: docs/BENCHMARKS.md, host time per call.
//
// The CUDA driver is found at run time (dlopen of libcuda.so.1, which torch and CuPy have loaded by then), so
// the file builds on a machine without CUDA; there every call answers "not launched" (None) and the caller
// takes the Python path, as it does when the calling thread's current CUDA context is not the one the
// kernel was loaded in.

#include <torch/extension.h>

#include <dlfcn.h>

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

namespace {

using CUresult = int;
using CUfunction = void*;
using CUstream = void*;
using CUcontext = void*;
using LaunchKernelFn = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, CUstream, void**, void**);
using CtxGetCurrentFn = CUresult (*)(CUcontext*);
using GetErrorNameFn = CUresult (*)(CUresult, const char**);

constexpr int kParams = 18;  // es_spmm_kernel's parameters (spmm_cuda.ARG_KINDS)
constexpr int kX = 3, kDinv = 4, kOut = 5;  // the slots filled per call
constexpr CUresult kInvalidContext = 201;  // CUDA_ERROR_INVALID_CONTEXT

struct Driver {
    LaunchKernelFn launch = nullptr;
    CtxGetCurrentFn current = nullptr;
    GetErrorNameFn error_name = nullptr;
};

const Driver& driver() {
    static const Driver d = [] {
        Driver r;
        void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_LAZY);
        if (lib != nullptr) {
            r.launch = reinterpret_cast<LaunchKernelFn>(dlsym(lib, "cuLaunchKernel"));
            r.current = reinterpret_cast<CtxGetCurrentFn>(dlsym(lib, "cuCtxGetCurrent"));
            r.error_name = reinterpret_cast<GetErrorNameFn>(dlsym(lib, "cuGetErrorName"));
        }
        return r;
    }();
    return d;
}

class Launch {
   public:
    // function, context: the kernel instance's CUfunction and the CUcontext it was loaded in; blocks, threads,
    // shared_bytes: the launch shape; args: the 18 parameters (each call copies them and sets slots 3-5); split: the
    // output is the accumulation type (float, double for double inputs) and starts at zero; vector: the
    // instance reads and writes 128-bit vectors (the output must be 16-byte aligned).
    Launch(int64_t function, int64_t context, int64_t blocks, int64_t threads, int64_t shared_bytes,
           const std::vector<int64_t>& args, bool split, bool vector)
        : function_(reinterpret_cast<CUfunction>(static_cast<intptr_t>(function))),
          context_(reinterpret_cast<CUcontext>(static_cast<intptr_t>(context))),
          blocks_(static_cast<unsigned>(blocks)),
          threads_(static_cast<unsigned>(threads)),
          shared_bytes_(static_cast<unsigned>(shared_bytes)),
          split_(split),
          vector_(vector) {
        if (args.size() != kParams) {
            throw std::invalid_argument("Launch takes " + std::to_string(kParams) + " kernel arguments, got " +
                                        std::to_string(args.size()));
        }
        if (blocks < 1 || threads < 1) throw std::invalid_argument("Launch needs at least one block and thread");
        if (function == 0 || context == 0) throw std::invalid_argument("Launch needs a kernel function and its context");
        for (int i = 0; i < kParams; ++i) slots_[i] = static_cast<uint64_t>(args[i]);
    }

    // The output and the parameters of a launch over x (dinv: the gcn normalisation's device pointer, or 0),
    // without launching: what the tests compare with Python's plan.
    std::tuple<at::Tensor, std::vector<int64_t>> arguments(const at::Tensor& x, int64_t dinv) const {
        std::array<uint64_t, kParams> slots;
        at::Tensor out = fill(x, dinv, slots);
        std::vector<int64_t> args(kParams);
        for (int i = 0; i < kParams; ++i) args[i] = static_cast<int64_t>(slots[i]);
        return {out, args};
    }

    // Allocate the output, fill the parameters, launch on `stream`. None when this thread cannot launch here
    // (no CUDA driver, or its current context is not the kernel's: the caller's Python path binds it). A
    // launch the driver refuses otherwise raises. The parameters are this call's own copy (several threads
    // may launch one Launch), and the GIL is released while the driver enqueues (it may wait for room).
    std::optional<at::Tensor> operator()(const at::Tensor& x, int64_t dinv, int64_t stream) const {
        const Driver& d = driver();
        if (d.launch == nullptr || d.current == nullptr) return std::nullopt;
        CUcontext current = nullptr;
        if (d.current(&current) != 0 || current == nullptr || current != context_) return std::nullopt;
        std::array<uint64_t, kParams> slots;
        at::Tensor out = fill(x, dinv, slots);
        std::array<void*, kParams> pointers;
        for (int i = 0; i < kParams; ++i) pointers[i] = &slots[i];
        CUresult rc;
        {
            py::gil_scoped_release unlocked;
            rc = d.launch(function_, blocks_, 1, 1, threads_, 1, 1, shared_bytes_,
                          reinterpret_cast<CUstream>(static_cast<intptr_t>(stream)), pointers.data(), nullptr);
        }
        if (rc == kInvalidContext) return std::nullopt;
        if (rc != 0) {
            const char* name = nullptr;
            if (d.error_name != nullptr) d.error_name(rc, &name);
            throw std::runtime_error("cuLaunchKernel failed for es_spmm_kernel: " +
                                     std::string(name != nullptr ? name : "CUDA error") + " (" + std::to_string(rc) +
                                     ")");
        }
        return out;
    }

   private:
    // The output (x's type, or zeroed in the accumulation type when rows are split) and `slots`: the
    // prepared parameters with this call's x, dinv and output pointers.
    at::Tensor fill(const at::Tensor& x, int64_t dinv, std::array<uint64_t, kParams>& slots) const {
        TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "Launch: x must be a contiguous [N, F] tensor");
        TORCH_CHECK(static_cast<int64_t>(slots_[10]) == x.size(0) && static_cast<int64_t>(slots_[11]) == x.size(1),
                    "Launch: x has shape [", x.size(0), ", ", x.size(1), "], the launch was prepared for [",
                    static_cast<int64_t>(slots_[10]), ", ", static_cast<int64_t>(slots_[11]), "]");
        at::Tensor out = split_ ? at::zeros_like(x, x.options().dtype(x.scalar_type() == at::kDouble ? at::kDouble
                                                                                                       : at::kFloat))
                                : at::empty_like(x);
        const auto out_ptr = reinterpret_cast<uintptr_t>(out.data_ptr());
        TORCH_CHECK(!vector_ || out_ptr % 16 == 0, "Launch: the output is not 16-byte aligned");
        slots = slots_;
        slots[kX] = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(x.data_ptr()));
        slots[kDinv] = static_cast<uint64_t>(dinv);
        slots[kOut] = static_cast<uint64_t>(out_ptr);
        return out;
    }

    CUfunction function_;
    CUcontext context_;
    unsigned blocks_, threads_, shared_bytes_;
    bool split_, vector_;
    std::array<uint64_t, kParams> slots_{};  // the prepared parameters; never written after construction
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "es_spmm_kernel's launch in C++ (kernels/launcher.cpp)";
    m.attr("PARAMS") = kParams;
    py::class_<Launch>(m, "Launch")
        .def(py::init<int64_t, int64_t, int64_t, int64_t, int64_t, const std::vector<int64_t>&, bool, bool>(),
             py::arg("function"), py::arg("context"), py::arg("blocks"), py::arg("threads"), py::arg("shared_bytes"),
             py::arg("args"), py::arg("split"), py::arg("vector"))
        .def("arguments", &Launch::arguments, py::arg("x"), py::arg("dinv"))
        .def("__call__", &Launch::operator(), py::arg("x"), py::arg("dinv"), py::arg("stream"));
    m.def("has_driver", [] { return driver().launch != nullptr; });
}
