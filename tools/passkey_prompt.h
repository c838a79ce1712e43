/* passkey_prompt.h - the passkey prompt format the bundled model was trained
 * on (models/kvq-tiny-llama/FIXTURES.md):
 *   INTRO + FILLER*a + " The pass key is KEY. Remember it. KEY is the pass key. "
 *         + FILLER*b + " What is the pass key? The pass key is"
 */
#ifndef KVQ_PASSKEY_PROMPT_H
#define KVQ_PASSKEY_PROMPT_H

/** The prompt text (malloc'ed, NUL-terminated; NULL when out of memory)
 *  with a fillers before the key sentence and b after. */
char *passkey_prompt_text(long key, int a, int b);

#endif
