// The one place a c10d TCPStore is made (the trainer's rendezvous, and the test that plays torchrun's agent).
#pragma once
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <string>

namespace qwen3 {

// PyTorch 2.4 and later default to the libuv transport, which a libtorch built without libuv (Debian's 2.6)
// refuses with "use_libuv was requested but PyTorch was build without libuv support": the store is then made
// again with the socket transport that every version has. Other failures are thrown as they come.
c10::intrusive_ptr<c10d::TCPStore> make_tcp_store(const std::string& host, c10d::TCPStoreOptions options);

}  // namespace qwen3
