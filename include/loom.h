/*
 * loom.h: every public header of libloom, for embedders.
 *
 * An embedder includes this one header (or the few loom/<module>.h it
 * needs) and links with `pkg-config --cflags --libs loom`; see
 * docs/embedding.md. Each header below also stands alone, in C11 and in
 * C++. The HTTP server (loom/server.h) lives in its own library,
 * libloom-server, which pkg-config's `loom-server` module links.
 */
#ifndef LOOM_H
#define LOOM_H

#include "loom/accounts.h"
#include "loom/agent.h"
#include "loom/buf.h"
#include "loom/cancel.h"
#include "loom/common.h"
#include "loom/config.h"
#include "loom/context.h"
#include "loom/jwt.h"
#include "loom/limits.h"
#include "loom/llm.h"
#include "loom/log.h"
#include "loom/mcp.h"
#include "loom/memory.h"
#include "loom/message.h"
#include "loom/pool.h"
#include "loom/recorder.h"
#include "loom/router.h"
#include "loom/run.h"
#include "loom/server.h"
#include "loom/session.h"
#include "loom/sse.h"
#include "loom/store.h"
#include "loom/tokenizer.h"
#include "loom/tools.h"

#endif
