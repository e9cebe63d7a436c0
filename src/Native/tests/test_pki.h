// Throwaway certificates for the native tests and benchmarks (made in memory, never written).
#pragma once
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

typedef struct Pem
{
    char* certificate;
    int certificateLength;
    char* key;
    int keyLength;
} Pem;

// Keys: ECDSA P-256, or Ed25519, whose signatures have one length (ECDSA's vary by a byte or
// two), so that handshakes with it have the same lengths in every run (the fuzz target's needs).
typedef enum KeyType
{
    KeyP256,
    KeyEd25519,
} KeyType;

// A self-signed ECDSA P-256 certificate for host, valid for 30 days, and its key, in PEM.
Pem MakeCertificate(const char* host);
// The same with a key of the given type and names more DNS names in its subjectAltName: each adds
// its length and 2 bytes (1,000 names of large.fuzz.test make a certificate of about 22 KB).
Pem MakeLargeCertificate(const char* host, int names, KeyType type);
void FreePem(Pem* pem);

// A certificate and its key.
typedef struct Identity
{
    X509* certificate;
    EVP_PKEY* key;
} Identity;

// A certificate for cn signed by issuer (self-signed when issuer is NULL): a CA when ca is 1,
// else a leaf for client authentication (0) or for servers only (2), with a key of the given
// type. Valid for 30 days.
X509* MakeIssued(const char* cn, X509* issuer, EVP_PKEY* issuerKey, int ca, KeyType type, EVP_PKEY** key);

// What the client-certificate tests need: a client CA and a certificate it issued for client
// authentication, another CA and one of its own, and the first CA in PEM (the trusted list).
typedef struct ClientPki
{
    Identity authority;
    Identity trusted;
    Identity other;
    Identity stranger;
    char* authorityPem;
    int authorityPemLength;
} ClientPki;

ClientPki MakeClientPki(KeyType type);
void FreeClientPki(ClientPki* pki);

// A copy of a memory BIO's contents, NUL-terminated; the caller frees it.
char* BioText(BIO* bio, int* length);
