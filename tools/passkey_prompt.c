/* passkey_prompt.c - the fixture's passkey prompt text. */
#include "passkey_prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char INTRO[] = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
                            "it. I will quiz you about the important information there. ";
static const char FILLER[] = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";
static const char QUESTION[] = " What is the pass key? The pass key is";

char *passkey_prompt_text(long key, int a, int b)
{
    char sentence[160];
    snprintf(sentence, sizeof sentence, " The pass key is %ld. Remember it. %ld is the pass key. ", key, key);
    size_t fl = strlen(FILLER);
    size_t len = strlen(INTRO) + (size_t)(a + b) * fl + strlen(sentence) + strlen(QUESTION) + 1;
    char *t = malloc(len), *p = t;
    if (!t)
        return NULL;
    p += sprintf(p, "%s", INTRO);
    for (int i = 0; i < a; i++, p += fl)
        memcpy(p, FILLER, fl);
    p += sprintf(p, "%s", sentence);
    for (int i = 0; i < b; i++, p += fl)
        memcpy(p, FILLER, fl);
    sprintf(p, "%s", QUESTION);
    return t;
}
