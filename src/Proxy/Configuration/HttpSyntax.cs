using System.Buffers;
using System.Text;

namespace Tern.Proxy.Configuration;

/// <summary>RFC 9110's syntax for the header and cookie names and values a configuration gives.</summary>
internal static class HttpSyntax
{
    /// <summary>What a token (a header or cookie name) may hold, as said in problems.</summary>
    public const string TokenChars = "letters, digits and !#$%&'*+-.^_`|~";

    private static readonly SearchValues<char> s_tokenChars =
        SearchValues.Create("!#$%&'*+-.0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ^_`abcdefghijklmnopqrstuvwxyz|~");

    /// <summary>Whether the text is a token (RFC 9110, 5.6.2): a header name, a cookie name, a method.</summary>
    public static bool IsToken(string text) => text.Length > 0 && !text.AsSpan().ContainsAnyExcept(s_tokenChars);

    /// <summary>
    /// The first control character in a field value (RFC 9110, 5.5: anything below a space but a
    /// tab, and DEL), or null. Kestrel refuses a response header that has one; .NET's client drops
    /// a request header with a line break, and sends the others as they are, for upstreams to refuse.
    /// </summary>
    public static char? FirstControl(string value)
    {
        foreach (var c in value)
        {
            if ((c < ' ' && c != '\t') || c == '\x7f')
            {
                return c;
            }
        }

        return null;
    }

    /// <summary>
    /// The first character outside ASCII in a value Tern sends, or null. Tern writes header
    /// characters as one byte each (Latin-1, so that a client's bytes pass unchanged: HeaderBytes):
    /// U+0080-U+00FF go as that byte, not as UTF-8, and any other as '?'.
    /// </summary>
    public static char? FirstNonAscii(string value)
    {
        var at = value.AsSpan().IndexOfAnyExceptInRange('\0', '\x7f');
        return at < 0 ? null : value[at];
    }

    /// <summary>The first percent escape (%XX) in the text, or null.</summary>
    public static string? FirstEscape(string text)
    {
        for (var at = text.IndexOf('%', StringComparison.Ordinal); at >= 0 && at + 2 < text.Length; at = text.IndexOf('%', at + 1))
        {
            if (char.IsAsciiHexDigit(text[at + 1]) && char.IsAsciiHexDigit(text[at + 2]))
            {
                return text.Substring(at, 3);
            }
        }

        return null;
    }

    /// <summary>
    /// A path as Kestrel decodes a request's before routing: each escape of a UTF-8 character but
    /// %2F, which it keeps, as it keeps escapes that make no UTF-8 (%FF).
    /// </summary>
    public static string DecodedAsPath(string path)
    {
        var decoded = new StringBuilder(path.Length);
        var rest = path.AsSpan();
        for (var at = rest.IndexOf("%2F", StringComparison.OrdinalIgnoreCase); at >= 0; at = rest.IndexOf("%2F", StringComparison.OrdinalIgnoreCase))
        {
            decoded.Append(Uri.UnescapeDataString(rest[..at])).Append(rest.Slice(at, 3));
            rest = rest[(at + 3)..];
        }

        return decoded.Append(Uri.UnescapeDataString(rest)).ToString();
    }

    /// <summary>A query name or value as ASP.NET Core's Request.Query decodes it, where that differs from the text; null where not.</summary>
    public static string? DecodedAsQuery(string text) => Uri.UnescapeDataString(text) is var plain && plain != text ? plain : null;

    /// <summary>
    /// What to write for a path written with escapes, given it decoded: that, or, where no
    /// request's path decodes to it (Kestrel refuses a NUL and resolves dot segments before
    /// routing), that none can.
    /// </summary>
    public static string WriteDecoded(string decoded) =>
        decoded.Contains('\0', StringComparison.Ordinal) || decoded.Split('/').Any(s => s is "." or "..")
            ? "and no request's path decodes to it (Kestrel refuses a NUL, and resolves dot segments before routing): remove it"
            : $"write '{decoded}'";

    /// <summary>A character as a problem names it: U+000D.</summary>
    public static string Name(char c) => $"U+{(int)c:X4}";
}
