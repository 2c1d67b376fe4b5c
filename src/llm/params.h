/*
 * llm/params.h: a client's request parameters (loom_llm_params) as each
 * provider kind's wire format says them. One function per adapter puts
 * them into the request body that adapter builds; which kind refuses
 * which parameter is one table, in params.c, that loom_llm_params_refused
 * reads and docs/openai-compat.md shows.
 */
#ifndef LOOM_LLM_PARAMS_H
#define LOOM_LLM_PARAMS_H

#include "loom/llm.h"

#include <jansson.h>

/*
 * Each function adds p's parameters (NULL: none) to a request body of its
 * kind, the parameters the kind refuses left out (they were refused
 * before the body is built). 0, or -1 on OOM (the builders' convention).
 */

/* Chat Completions: the OpenAI names as they are. */
int loom__params_put_openai(json_t *body, const loom_llm_params *p);
/* Anthropic Messages: top_p, stop_sequences, metadata.user_id (the
 * response format is a tool: loom__anthropic_build_body). */
int loom__params_put_anthropic(json_t *body, const loom_llm_params *p);
/* Gemini: into generationConfig (topP, seed, penalties, stopSequences,
 * responseMimeType and responseJsonSchema). */
int loom__params_put_gemini(json_t *generation_config,
                            const loom_llm_params *p);
/* Responses: top_p, text.format, text.verbosity, user and the extras it
 * takes. */
int loom__params_put_responses(json_t *body, const loom_llm_params *p);

/*
 * The reasoning effort a request asks for: the client's (p), else the
 * model's configured one (req_effort); NULL when neither.
 */
const char *loom__params_effort(const loom_llm_params *p,
                                const char *req_effort);

/*
 * The thinking budget in tokens that stands for a reasoning effort where
 * a provider takes a budget rather than an effort (Anthropic, Gemini):
 * minimal 1024, low 2048, medium 8192, high 24576; 0 for NULL or an
 * unknown effort.
 */
long loom__params_effort_budget(const char *effort);

#endif
