// Throwaway certificates for the native tests and benchmarks (made in memory, never written).
#pragma once
#include <openssl/bio.h>

typedef struct Pem
{
    char* certificate;
    int certificateLength;
    char* key;
    int keyLength;
} Pem;

// A self-signed ECDSA P-256 certificate for host, valid for an hour, and its key, in PEM.
Pem MakeCertificate(const char* host);
// The same with names more DNS names in its subjectAltName: each adds its length and 2 bytes
// (1,000 names of large.fuzz.test make a certificate of about 22 KB).
Pem MakeLargeCertificate(const char* host, int names);
void FreePem(Pem* pem);

// A copy of a memory BIO's contents, NUL-terminated; the caller frees it.
char* BioText(BIO* bio, int* length);
