// Throwaway certificates for the native tests and benchmarks (test_pki.h).
#include "test_pki.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char* BioText(BIO* bio, int* length)
{
    char* data = NULL;
    long size = BIO_get_mem_data(bio, &data);
    char* copy = malloc((size_t)size + 1);
    memcpy(copy, data, (size_t)size);
    copy[size] = '\0';
    *length = (int)size;
    return copy;
}

// An unsigned X.509 v3 certificate for cn with a new key, valid from a minute ago for 30 days
// (a fuzzing run may last hours), issued by issuer (by itself when NULL).
static X509* NewCertificate(const char* cn, X509* issuer, long serial, KeyType type, EVP_PKEY** key)
{
    *key = type == KeyEd25519 ? EVP_PKEY_Q_keygen(NULL, NULL, "ED25519") : EVP_EC_gen("P-256");
    X509* certificate = X509_new();
    X509_set_version(certificate, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(certificate), serial);
    X509_gmtime_adj(X509_getm_notBefore(certificate), -60);
    X509_gmtime_adj(X509_getm_notAfter(certificate), 30L * 24 * 3600);
    X509_set_pubkey(certificate, *key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(certificate), "CN", MBSTRING_ASC, (const unsigned char*)cn, -1, -1, 0);
    X509_set_issuer_name(certificate, X509_get_subject_name(issuer == NULL ? certificate : issuer));
    return certificate;
}

// Signs with SHA-256, or with Ed25519 alone (which takes no digest).
static void Sign(X509* certificate, EVP_PKEY* key)
{
    X509_sign(certificate, key, EVP_PKEY_is_a(key, "ED25519") ? NULL : EVP_sha256());
}

Pem MakeCertificate(const char* host)
{
    return MakeLargeCertificate(host, 0, KeyP256);
}

Pem MakeLargeCertificate(const char* host, int names, KeyType type)
{
    EVP_PKEY* key = NULL;
    X509* certificate = NewCertificate(host, NULL, 1, type, &key);
    if (names > 0)
    {
        // DNS:n0.host,DNS:n1.host,...: each name adds its length and 2 bytes to the certificate.
        size_t capacity = (size_t)names * (strlen(host) + 16);
        char* list = malloc(capacity);
        size_t used = 0;
        for (int i = 0; i < names; i++)
        {
            used += (size_t)snprintf(list + used, capacity - used, "%sDNS:n%d.%s", i == 0 ? "" : ",", i, host);
        }

        X509_EXTENSION* extension = X509V3_EXT_conf_nid(NULL, NULL, NID_subject_alt_name, list);
        X509_add_ext(certificate, extension, -1);
        X509_EXTENSION_free(extension);
        free(list);
    }

    Sign(certificate, key);

    BIO* certificateBio = BIO_new(BIO_s_mem());
    BIO* keyBio = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(certificateBio, certificate);
    PEM_write_bio_PrivateKey(keyBio, key, NULL, NULL, 0, NULL, NULL);
    Pem pem;
    pem.certificate = BioText(certificateBio, &pem.certificateLength);
    pem.key = BioText(keyBio, &pem.keyLength);
    BIO_free(certificateBio);
    BIO_free(keyBio);
    X509_free(certificate);
    EVP_PKEY_free(key);
    return pem;
}

X509* MakeIssued(const char* cn, X509* issuer, EVP_PKEY* issuerKey, int ca, KeyType type, EVP_PKEY** key)
{
    X509* certificate = NewCertificate(cn, issuer, ca ? 1 : 2, type, key);
    X509V3_CTX context;
    X509V3_set_ctx_nodb(&context);
    X509V3_set_ctx(&context, issuer == NULL ? certificate : issuer, certificate, NULL, NULL, 0);
    X509_EXTENSION* extension = ca == 1 ? X509V3_EXT_conf_nid(NULL, &context, NID_basic_constraints, "critical,CA:TRUE")
                                   : X509V3_EXT_conf_nid(NULL, &context, NID_ext_key_usage, ca == 2 ? "serverAuth" : "clientAuth");
    X509_add_ext(certificate, extension, -1);
    X509_EXTENSION_free(extension);
    Sign(certificate, issuerKey == NULL ? *key : issuerKey);
    return certificate;
}

ClientPki MakeClientPki(KeyType type)
{
    ClientPki pki;
    pki.authority.certificate = MakeIssued("Test Client CA", NULL, NULL, 1, type, &pki.authority.key);
    pki.other.certificate = MakeIssued("Another CA", NULL, NULL, 1, type, &pki.other.key);
    pki.trusted.certificate = MakeIssued("client.test", pki.authority.certificate, pki.authority.key, 0, type, &pki.trusted.key);
    pki.stranger.certificate = MakeIssued("stranger.test", pki.other.certificate, pki.other.key, 0, type, &pki.stranger.key);
    BIO* bio = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(bio, pki.authority.certificate);
    pki.authorityPem = BioText(bio, &pki.authorityPemLength);
    BIO_free(bio);
    return pki;
}

void FreeClientPki(ClientPki* pki)
{
    Identity* all[] = {&pki->authority, &pki->trusted, &pki->other, &pki->stranger};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
    {
        X509_free(all[i]->certificate);
        EVP_PKEY_free(all[i]->key);
    }

    free(pki->authorityPem);
}

void FreePem(Pem* pem)
{
    free(pem->certificate);
    free(pem->key);
}

