/*
 * Internal to the store: the client-visible form of a conversation and
 * its hash, by which a client that resends its whole history (and no
 * conversation id) is recognised as continuing a stored conversation
 * (loom_store_conversation_match, docs/store.md#client-visible-form).
 *
 * A client sees a conversation as the messages it sends and the answers
 * it gets back: its own system, user and tool messages as sent, and for
 * each turn one assistant message holding the answer's text and the tool
 * calls it must answer itself. loom's own (server-run) tool calls and
 * their results never reach it, so they are not part of that form. The
 * hash is a chain over the visible messages, h(n + 1) = SHA-256(h(n) ||
 * encoding of message n), so a store extends it turn by turn without
 * reading old messages, and a request's messages hash the same way.
 *
 * A streamed answer's text is every text delta of the turn, while a
 * non-streamed answer's is the text of the turn's last model call: the
 * two differ when the model spoke before calling loom's tools. So every
 * turn extends two chains, one per way of being answered.
 */
#ifndef LOOM_STORE_TRANSCRIPT_H
#define LOOM_STORE_TRANSCRIPT_H

#include "loom/message.h"

/* Bytes of a transcript hash (SHA-256). */
#define LOOM__TRANSCRIPT_HASH_SIZE 32

/* The two chains of a conversation. */
typedef struct {
    unsigned char last[LOOM__TRANSCRIPT_HASH_SIZE];     /* non-streamed */
    unsigned char streamed[LOOM__TRANSCRIPT_HASH_SIZE]; /* streamed */
} loom__transcript;

/* The hash of the empty conversation (both chains start there). */
void loom__transcript_init(loom__transcript *t);

/* Whether t's two chains have parted (a model spoke before loom's tools
 * ran): their hashes differ. */
int loom__transcript_parted(const loom__transcript *t);

/*
 * Extends h by the messages of m as they are: each as a client sends it
 * (a request's messages, a turn's input). Assistant messages count with
 * all their tool calls. LOOM_ENOMEM, or LOOM_ERROR when the digest fails.
 */
int loom__transcript_add(unsigned char h[LOOM__TRANSCRIPT_HASH_SIZE],
                         const loom_messages *m);

/*
 * Extends both chains of t by one stored turn: its input as it is, then
 * its output (assistant and tool messages of the run) as the one
 * assistant message the client got: the text of every assistant message
 * joined (streamed) or of the last one (non-streamed), with the tool
 * calls no tool message of the output answers (the client's own). An
 * output with no assistant message is an empty answer. Errors as
 * loom__transcript_add.
 */
int loom__transcript_add_turn(loom__transcript *t, const loom_messages *input,
                              const loom_messages *output);

#endif
