using System.Net.Http;
using System.Text;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// Header values cross Tern as the bytes they arrived as, in both directions, as through nginx.
/// </summary>
/// <remarks>
/// RFC 9110 (5.5) allows octets 0x80-0xFF in a field value (obs-text) and tells a recipient to
/// treat them as opaque data. .NET does not by default: Kestrel decodes request headers as UTF-8
/// and answers 400 to any other bytes; .NET's HTTP client refuses to send a request header that
/// is not ASCII (a 502 for the client's own header); Kestrel refuses to write a response header
/// that is not ASCII (a 502 for an upstream's <c>Content-Disposition: filename="café.txt"</c>).
/// Latin-1 maps each byte to the one character of the same value and back, so decoding with it on
/// one side and encoding with it on the other passes every byte unchanged: Kestrel reads request
/// headers with it, the upstream client writes them with it, the upstream client reads response
/// headers with it (its default), and Kestrel writes them with it. CR, LF and NUL stay refused
/// or replaced as before (README, Routes and clusters). Kestrel and .NET's client each have a
/// vectorised path for Latin-1, so the cost is the selector's call per header.
/// </remarks>
internal static class HeaderBytes
{
    public static readonly Func<string, Encoding?> Kestrel = static _ => Encoding.Latin1;

    public static readonly HeaderEncodingSelector<HttpRequestMessage> Upstream = static (_, _) => Encoding.Latin1;
}
