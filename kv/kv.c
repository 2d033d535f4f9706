// Placeholder: the KV cache lands with the KV issue.
#include "kv/kv.h"
