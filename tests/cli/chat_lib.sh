# Shared by the shell tests of `loom chat` (sourced, not run): the fake
# upstream's script for a chat (research_lib.sh starts it and writes the
# config r.yaml, prices $1/$2 per million tokens), and helpers that read
# the store loom chat writes ($tmp/chat.db) with sqlite3.
. "$(dirname "$0")/research_lib.sh"

# Turn 1 calls get_time then answers (reasoning first, and an escape
# sequence that must never reach a terminal raw); turn 2 is answered only
# when its request holds turn 1's answer (the history); "slow question"
# streams a word then hangs (Ctrl-C); "delta question" is answered only
# with "Gamma answer." in the history (the same conversation, continued).
# Without its history a turn gets "NO HISTORY" from the plain answers.
CHAT_SCRIPT='{"rules":[
 {"match":{"system":"Write a short title"},"loop":true,"responses":[{"text":["Alpha chat"],
   "usage":{"prompt_tokens":30,"completion_tokens":2,"total_tokens":32}}]},
 {"match":{"last_message":"beta question","any_message":"Alpha answer."},"loop":true,"responses":[
   {"text":["Beta answer, ","after alpha."],"usage":{"prompt_tokens":200,"completion_tokens":7,"total_tokens":207}}]},
 {"match":{"last_message":"slow question"},"loop":true,"responses":[
   {"text":["Slow start"],"hang":true,"hang_after_chunks":2}]},
 {"match":{"last_message":"gamma question"},"loop":true,"responses":[
   {"text":["Gamma answer."],"usage":{"prompt_tokens":300,"completion_tokens":3,"total_tokens":303}}]},
 {"match":{"last_message":"delta question","any_message":"Gamma answer."},"loop":true,"responses":[
   {"text":["Delta sees gamma."],"usage":{"prompt_tokens":400,"completion_tokens":4,"total_tokens":404}}]},
 {"match":{"first_user":"alpha question"},"responses":[
   {"reasoning":["thinking hard"],"tool_calls":[{"id":"call_t","name":"get_time","arguments":"{\"timezone\":\"UTC\"}"}],
    "usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":110}},
   {"text":["Alpha answer.","\u001b[2J\n"],"usage":{"prompt_tokens":150,"completion_tokens":5,"total_tokens":155}}]}],
 "loop":true,"responses":[{"text":["NO HISTORY"]}]}'

loom_chat() {
    env -i ${TSAN_OPTIONS:+"TSAN_OPTIONS=$TSAN_OPTIONS"} PATH="$PATH" HOME="$tmp" "$LOOM_BIN" chat -c "$tmp/r.yaml" \
        --db "$tmp/chat.db" "$@"
}
# The newest conversation's id.
last_conversation() {
    sqlite3 "$tmp/chat.db" \
        "SELECT id FROM conversations ORDER BY updated_at DESC LIMIT 1"
}
# What /cost must say of conversation $1: its usage rows summed.
expected_cost() {
    sqlite3 -separator ' ' "$tmp/chat.db" "SELECT count(*), sum(total_tokens),
        sum(prompt_tokens), sum(completion_tokens), sum(cost_micros)
        FROM usage WHERE conversation_id = '$1'" |
    while read -r n total prompt completion micros; do
        printf '%s: %s model calls, %s tokens (%s prompt, %s completion), $%d.%06d\n' \
            "$1" "$n" "$total" "$prompt" "$completion" \
            $((micros / 1000000)) $((micros % 1000000))
    done
}
