#include "pal_internal.h"

#include <openssl/err.h>
#include <string.h>

int32_t TernCopyText(const char* text, size_t length, char* buffer, int32_t capacity)
{
    if (buffer == NULL || capacity < 1)
    {
        return -1;
    }

    size_t copied = length < (size_t)capacity - 1 ? length : (size_t)capacity - 1;
    if (copied > 0)
    {
        memcpy(buffer, text, copied);
    }

    buffer[copied] = '\0';
    return (int32_t)copied;
}

void TernDrainErrors(char* buffer, size_t capacity)
{
    size_t used = 0;
    buffer[0] = '\0';
    unsigned long code;
    while ((code = ERR_get_error()) != 0)
    {
        if (used + 3 >= capacity)
        {
            continue; // keep draining so the queue is left empty
        }

        if (used > 0)
        {
            memcpy(buffer + used, "; ", 2);
            used += 2;
        }

        ERR_error_string_n(code, buffer + used, capacity - used);
        used += strlen(buffer + used);
    }
}

int32_t TernTls_LastErrorText(char* buffer, int32_t capacity)
{
    if (buffer == NULL || capacity < 1)
    {
        return -1;
    }

    TernDrainErrors(buffer, (size_t)capacity);
    return (int32_t)strlen(buffer);
}
