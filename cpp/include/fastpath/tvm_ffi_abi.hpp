// The part of tvm-ffi's C ABI (tvm/ffi/c_api.h) that the guided fill calls, and DLPack's tensor
// view. Both ABIs are stable by their projects' promise; the entry points come from Python at run
// time (ctypes), so nothing here links tvm-ffi or needs its headers to build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fastpath::hostdispatch::tvm_ffi_abi {

struct Object {  // TVMFFIObject: every object starts with this header
  std::uint64_t combined_ref_count;
  std::int32_t type_index;
  std::uint32_t padding;
  void* deleter;
};

struct Any {  // TVMFFIAny: a tagged 16-byte value
  std::int32_t type_index;
  std::uint32_t zero_padding;
  union {
    std::int64_t v_int64;
    void* v_ptr;
    Object* v_obj;
  };
};
static_assert(sizeof(Object) == 24 && sizeof(Any) == 16, "tvm-ffi's C ABI layout");

inline constexpr std::int32_t kNone = 0, kInt = 1, kBool = 2, kDLTensorPtr = 7, kObjectBegin = 64;

struct ByteArray {
  const char* data;
  std::size_t size;
};
struct ErrorCell {  // follows the Object header of an ffi.Error
  ByteArray kind;
  ByteArray message;
};

using FunctionCall = int (*)(void* func, Any* args, std::int32_t num_args, Any* result);
using ObjectRefFn = int (*)(void* obj);
using ErrorMoveFromRaised = void (*)(void** result);

// DLPack's DLTensor: a view the callee reads, never owns.
struct DLTensor {
  void* data;
  std::int32_t device_type;  // kDLCPU = 1 (pinned host memory is CPU memory to the callee)
  std::int32_t device_id;
  std::int32_t ndim;
  std::uint8_t dtype_code;  // kDLInt = 0
  std::uint8_t dtype_bits;
  std::uint16_t dtype_lanes;
  std::int64_t* shape;
  std::int64_t* strides;  // null: compact row-major
  std::uint64_t byte_offset;
};

inline Any object_arg(void* obj) {
  Any a{};
  a.type_index = static_cast<Object*>(obj)->type_index;
  a.v_ptr = obj;
  return a;
}
inline Any int_arg(std::int64_t v) {
  Any a{};
  a.type_index = kInt;
  a.v_int64 = v;
  return a;
}
inline Any bool_arg(bool v) {
  Any a{};
  a.type_index = kBool;
  a.v_int64 = v ? 1 : 0;
  return a;
}
inline Any tensor_arg(DLTensor* t) {
  Any a{};
  a.type_index = kDLTensorPtr;
  a.v_ptr = t;
  return a;
}

}  // namespace fastpath::hostdispatch::tvm_ffi_abi
