// A rank's part in checkpoints, in three files: the shard mapping (checkpoint_shards.h: what
// a rank's shards hold, written and read back by ranges), the save protocol and the savers
// (checkpoint_save.h), and the resume rules (checkpoint_resume.h: what a continuation takes
// from the checkpoint). checkpoint/store.h has the directory's protocol,
// docs/checkpoint_format.md the format.
#pragma once

#include "train/checkpoint_resume.h"
#include "train/checkpoint_save.h"
#include "train/checkpoint_shards.h"
