using System.Buffers;

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
    /// tab, and DEL), or null: CR and LF would end the line, and .NET's client and Kestrel refuse
    /// the others.
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

    /// <summary>A character as a problem names it: U+000D.</summary>
    public static string Name(char c) => $"U+{(int)c:X4}";
}
