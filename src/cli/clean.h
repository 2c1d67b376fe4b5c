/*
 * Cleaning untrusted text for a terminal. Model output, tool output,
 * titles and errors may hold escape sequences that would move the
 * cursor, retitle the window or clear the screen; everything the loom
 * command prints from outside goes through cli_clean() first when it
 * goes to a terminal.
 */
#ifndef LOOM_CLI_CLEAN_H
#define LOOM_CLI_CLEAN_H

/*
 * s with every control character and escape sequence removed (CSI, OSC
 * and the other string sequences whole, C1 controls too); a newline and
 * a tab become a space unless flags keep them (CLI_KEEP_NL,
 * CLI_KEEP_TAB). A new string (caller frees); NULL when out of memory.
 * NULL s is "".
 *
 * Pieces of a stream may be cleaned one by one when each is valid UTF-8
 * (a C1 control then never spans two): a sequence cut off by a piece's
 * end is dropped whole, and its rest in the next piece is plain text.
 */
#define CLI_KEEP_NL 1
#define CLI_KEEP_TAB 2
char *cli_clean(const char *s, int flags);

#endif
