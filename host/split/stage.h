// The in-process transport (host/ops/transport.h has the interface and the
// list of implementations): between any two backends of this process
// through a host staging buffer, synchronous on the sending stage.
#ifndef VELA_HOST_STAGE_H
#define VELA_HOST_STAGE_H

#include <stdbool.h>
#include <stddef.h>

#include "gguf/verr.h"
#include "host/ops/backend.h"
#include "host/ops/transport.h"
#include "host/split/plan.h"

// The in-process transport over be[0..n-1] (all local, not owned).
int transport_inproc_create(struct transport **out, struct backend *const *be, int n,
                            struct verr *err);

#endif
