// Who a timed-out rank was really waiting for. Each rank that times out publishes the peer it was
// waiting for (`waiting_for(r)`, negative for a rank that has not timed out). Following those from
// `peer` leads to the end of the chain of waits: a rank that was not itself timed out (stalled,
// slower, or blocked outside this group), or a rank already seen (a cycle: each rank waits for
// the next, as when ranks call collectives in different orders).
#pragma once

#include <functional>
#include <string>

namespace shardwise::collectives {

// The clause a timeout error appends: empty when `peer` was not itself timed out, else
// "; rank 1 was itself timed out waiting for rank 2, rank 2 for rank 3 (the end of the chain of
// waits)". `self` is the rank reporting; `name(r)` is how rank r is written ("rank 3").
std::string describe_wait_chain(int self,
                                int peer,
                                int size,
                                const std::function<int(int)>& waiting_for,
                                const std::function<std::string(int)>& name);

}  // namespace shardwise::collectives
