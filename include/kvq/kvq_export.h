/* kvq_export.h - KVQ_API marks the functions and data libkvq exports.
 *
 * The library is compiled with -fvisibility=hidden, so libkvq.so exports
 * what carries KVQ_API in the public headers and nothing else
 * (tests/test_exports.sh checks both directions). Internal functions shared
 * between the library's own files stay linkable inside libkvq.a and
 * libkvq.so but are invisible to programs that link the shared library.
 */
#ifndef KVQ_EXPORT_H
#define KVQ_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define KVQ_API __attribute__((visibility("default")))
#else
#define KVQ_API
#endif

#endif /* KVQ_EXPORT_H */
