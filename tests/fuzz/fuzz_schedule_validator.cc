// libFuzzer target: pipeline schedules given to the validator (pipeline/schedule_validator.h).
// The input bytes become a Schedule: 4 header bytes (num_ranks, num_stages, num_microbatches,
// flags), then 3 bytes per action (rank, kind, stage/microbatch). Any schedule, however
// malformed (stages or ranks out of range, actions repeated, lists of the wrong count), must be
// rejected with a report or std::invalid_argument: never a crash, a hang or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "pipeline/schedule.h"
#include "pipeline/schedule_validator.h"

using namespace shardwise::pipeline;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  Schedule schedule;
  schedule.name = "fuzzed";
  // Small counts keep each run fast; values 0 and the signed edge are reachable.
  schedule.num_ranks = static_cast<int8_t>(data[0]) % 9;
  schedule.num_stages = static_cast<int8_t>(data[1]) % 17;
  schedule.num_microbatches = static_cast<int8_t>(data[2]) % 17;
  schedule.forward_only = data[3] & 1;
  const int lists = ((data[3] >> 1) & 0x3f) % 9;  // may differ from num_ranks
  schedule.ranks.resize(lists);
  for (size_t i = 4; i + 3 <= size; i += 3) {
    if (lists == 0) break;
    Action action;
    action.kind = static_cast<ActionKind>(data[i + 1] % 9);  // 8 is not a kind
    action.stage = static_cast<int8_t>(data[i + 2]) >> 3;
    action.microbatch = (static_cast<int8_t>(data[i + 2]) & 7) - 1;
    schedule.ranks[data[i] % lists].push_back(action);
  }
  CostModel costs;
  costs.buffered_sends = data[3] & 0x80;
  try {
    const ValidationReport report = validate(schedule, costs);
    if (report.ok && !report.error.empty()) __builtin_trap();  // ok means no error
    (void)to_string(schedule);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
