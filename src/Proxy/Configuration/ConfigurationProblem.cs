namespace Tern.Proxy.Configuration;

/// <summary>One thing wrong with the configuration, named by the key that caused it.</summary>
public sealed record ConfigurationProblem(string Key, string Message)
{
    public override string ToString() => $"{Key}: {Message}";
}

/// <summary>
/// A key Tern ignores, logged as a warning: one no part of Tern (or YARP) reads, or, where
/// GivenToSection, a section given a value of its own (Tern__Https=5, beside Tern:Https:Port).
/// Hint names the key meant, where one is close.
/// </summary>
public sealed record UnreadSetting(string Key, bool GivenToSection, string? Hint)
{
    /// <summary>Why it is ignored, which is also the event it is logged as (104, 107, 108, 109).</summary>
    public enum Kinds
    {
        NotTern,
        NotKestrelLimit,
        NotYarp,
        GivenToSection,
    }

    public Kinds Kind => Key.Split(':')[0] switch
    {
        _ when GivenToSection => Kinds.GivenToSection,
        var top when top.Equals("Kestrel", StringComparison.OrdinalIgnoreCase) => Kinds.NotKestrelLimit,
        var top when top.Equals(ReverseProxyValidator.Section, StringComparison.OrdinalIgnoreCase) => Kinds.NotYarp,
        _ => Kinds.NotTern,
    };

    /// <summary>What is said of the key, after it.</summary>
    public string Reason => Kind switch
    {
        Kinds.GivenToSection => $"is a section, not a setting: the value given to it is ignored; give the settings under it ({Key}:...; environment: {Key.Replace(":", "__", StringComparison.Ordinal)}__...)",
        Kinds.NotKestrelLimit => "is ignored: of the Kestrel section Tern reads only Kestrel:Limits; its listeners are set by Tern:Https:Port, Tern:Http:Port and Tern:Management:Port, their certificates by Tern:Tls:Certificates",
        Kinds.NotYarp => "is not read by YARP 2.1 and is ignored (" + Hint switch
        {
            null => "misspelt, or a setting of a later YARP?)",
            _ when Hint.Contains(':', StringComparison.Ordinal) => $"YARP reads it as {Hint} under {Key[..Key.LastIndexOf(':')]})",
            _ => $"misspelt? YARP reads {Hint})",
        },
        _ => "is not a Tern setting and is ignored (misspelt?)",
    };
}
