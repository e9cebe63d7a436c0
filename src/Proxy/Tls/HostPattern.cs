namespace Tern.Proxy.Tls;

/// <summary>Host names in certificate settings: exact names, or one leading wildcard label (*.example.com).</summary>
internal static class HostPattern
{
    public static bool IsValid(string host)
    {
        var name = Normalize(host);
        if (name.StartsWith("*.", StringComparison.Ordinal))
        {
            name = name[2..];
        }

        return name.Length is > 0 and <= 253 && name.Split('.').All(IsLabel);
    }

    public static string Normalize(string host) => host.Trim().TrimEnd('.').ToLowerInvariant();

    public static bool IsWildcard(string normalized) => normalized.StartsWith("*.", StringComparison.Ordinal);

    /// <summary>"a.example.com" → "example.com": the suffix a wildcard certificate for it is keyed by.</summary>
    public static string? ParentDomain(string normalized)
    {
        var dot = normalized.IndexOf('.', StringComparison.Ordinal);
        return dot > 0 && dot < normalized.Length - 1 ? normalized[(dot + 1)..] : null;
    }

    private static bool IsLabel(string label) =>
        label.Length is > 0 and <= 63
        && label[0] != '-' && label[^1] != '-'
        && label.All(c => char.IsAsciiLetterOrDigit(c) || c == '-');
}
