#include "pal_internal.h"

#include <openssl/crypto.h>
#include <string.h>

int32_t TernTls_AbiVersion(void)
{
    return TERN_TLS_ABI_VERSION;
}

int64_t TernTls_OpenSslVersionNumber(void)
{
    return (int64_t)OpenSSL_version_num();
}

int32_t TernTls_OpenSslVersionText(char* buffer, int32_t capacity)
{
    const char* text = OpenSSL_version(OPENSSL_VERSION);
    size_t length = strlen(text);
    if (TernCopyText(text, length, buffer, capacity) < 0)
    {
        return -1;
    }

    return length > INT32_MAX ? INT32_MAX : (int32_t)length;
}
