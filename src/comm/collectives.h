// The collectives, written once over a Transport (comm/transport.h): each one's schedule (who
// sends what to whom, in which phase) and its fold order (comm/reduce.h, in the orders
// communicator.h states). A backend supplies a transport; these algorithms decide, peer by
// peer, whether to read its data in place or to exchange messages with it, so the local
// backend (every rank here) and MPI (ranks in other processes) compute the same sums from
// the same inputs in the same order, and give the same bits. Schedules and the bytes each
// rank receives are described at the top of collectives.cc.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/transport.h"

namespace zerodp {

// A communicator whose collectives run over `transport`. Throws InvalidArgument when the
// ranks here neither lie inside one node of options.node_ranks nor make up the whole world.
std::unique_ptr<Communicator> make_transport_communicator(std::unique_ptr<Transport> transport,
                                                          const CommOptions& options);

}  // namespace zerodp
