// How the processes of a mesh that spans several machines find each other (the multi-GPU
// issue, multi-node): node 0 listens on --master-addr, every other node connects to it and
// sends a blob of its own (what it brings: its GPUs, its host); once all --nnodes have joined,
// node 0 sends every node all the blobs in node order, its own first. Node 0's blob carries
// what every rank needs to create the communicators (NCCL's unique id: ncclCommInitRank takes
// it with the global rank, which each node computes from the blobs before its own).
//
// The wire (TCP, one connection per node, closed after the answer): a node sends
// "KILNRDV1", nnodes and node_rank (uint32 little-endian), then its blob (uint32 length and
// bytes); node 0 answers "KILNRDV1", a status byte (0: ok, then nnodes blobs; 1: refused, then
// a message), and closes. Node 0 refuses a node whose nnodes differs from its own, whose
// node_rank is out of range or already joined, or whose header is not kiln's; every node gives
// up after the timeout, naming what it waited for. Documented in docs/multi-gpu.md.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "kiln/util/status.h"

namespace kiln::backend {

struct RendezvousOptions {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";  // node 0's address (a name or an IP)
  int master_port = 29500;                // node 0 listens there (0 on node 0: any free port)
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Parses "HOST:PORT" (an IPv6 address in brackets: "[::1]:29500") into addr and port.
Status parse_master_addr(const std::string& s, RendezvousOptions* o);

// Joins the rendezvous with `blob` (at most 1 MiB); every node's blob in node order.
// `on_listening`, called on node 0 once it listens, gets the port (tests bind port 0).
Expected<std::vector<std::string>> rendezvous(
    const RendezvousOptions& o, const std::string& blob,
    const std::function<void(int port)>& on_listening = {});

}  // namespace kiln::backend
