using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.WebUtilities;
using Microsoft.Extensions.Primitives;
using Tern.Proxy.Forwarding;

namespace Tern.Tests.Forwarding;

/// <summary>
/// What a route's Query* transforms leave of the client's query: only what they change is
/// written anew, the rest goes as the client wrote it (YARP rebuilt it whole from decoded values).
/// Each edit is made as YARP's transforms make it, on the parsed query.
/// </summary>
public sealed class RawQueryTests
{
    [Theory]
    [InlineData("?a+b=c+d&%41=%7e&flag", "append:n=v", "?a+b=c+d&%41=%7e&flag&n=v")] // YARP: a%20b=c%20d&A=~&flag=&n=v
    [InlineData("?x=1&y=2&x=3", "append:z=a b", "?x=1&y=2&x=3&z=a%20b")] // YARP put both x side by side
    [InlineData("?x=1&y=2&x=3", "append:x=4", "?x=1&y=2&x=3&x=4")]
    [InlineData("?y=a+b&x=1&X=2&z", "set:x=new", "?y=a+b&x=new&z")] // where the name first stood, once
    [InlineData("?x=a+b", "set:x=a b", "?x=a+b")] // the same value: unchanged
    [InlineData("?keep=a+b&drop=1&DROP=2&z", "remove:drop", "?keep=a+b&z")]
    [InlineData("?drop=1", "remove:drop", "")]
    [InlineData("?a=1", "remove:absent", "?a=1")] // YARP: rebuilt all the same
    [InlineData("", "set:q=a&b", "?q=a%26b")]
    [InlineData("?", "append:q=1", "?q=1")]
    [InlineData("?a=1&&b=%zz", "set:a=2", "?a=2&&b=%zz")] // an empty part, a broken escape: as written
    [InlineData("?q=%E2%82%AC", "append:r=€", "?q=%E2%82%AC&r=%E2%82%AC")]
    [InlineData("?keep=1;drop=1", "remove:drop", null)] // a ';' some upstreams split on: rebuilt, as YARP does
    [InlineData("?keep=a+b;x", "remove:absent", null)] // nothing changed as ASP.NET Core reads it, but a ';' all the same
    public void OnlyWhatTheTransformChanged_IsWrittenAnew(string query, string edit, string? expected)
    {
        var original = new QueryCollection(QueryHelpers.ParseQuery(query));
        var edited = new Dictionary<string, StringValues>(original, StringComparer.OrdinalIgnoreCase); // as YARP's QueryTransformContext
        var (mode, rest) = (edit[..edit.IndexOf(':', StringComparison.Ordinal)], edit[(edit.IndexOf(':', StringComparison.Ordinal) + 1)..]);
        var (name, value) = rest.Contains('=', StringComparison.Ordinal) ? (rest[..rest.IndexOf('=', StringComparison.Ordinal)], rest[(rest.IndexOf('=', StringComparison.Ordinal) + 1)..]) : (rest, "");
        switch (mode)
        {
            case "append":
                edited[name] = edited.TryGetValue(name, out var had) ? StringValues.Concat(had, value) : value;
                break;
            case "set":
                edited[name] = value;
                break;
            default:
                edited.Remove(name);
                break;
        }

        Assert.Equal(expected, RawQuery.Edited(query, original, edited));
    }
}
