namespace Tern.Proxy.Configuration;

/// <summary>One thing wrong with the configuration, named by the key that caused it.</summary>
public sealed record ConfigurationProblem(string Key, string Message)
{
    private readonly string _key = OneLine(Key);
    private readonly string _message = OneLine(Message);

    /// <summary>The key, on one line (a JSON key may hold a line break).</summary>
    public string Key { get => _key; init => _key = OneLine(value); }

    /// <summary>The message, on one line: values it quotes may hold line breaks and other control characters.</summary>
    public string Message { get => _message; init => _message = OneLine(value); }

    public override string ToString() => $"{Key}: {Message}";

    /// <summary>Control characters written as escapes (\n, \u0007), so that each problem is one line.</summary>
    public static string OneLine(string text)
    {
        if (!text.Any(char.IsControl))
        {
            return text;
        }

        var builder = new System.Text.StringBuilder(text.Length + 8);
        foreach (var c in text)
        {
            builder.Append(c switch
            {
                '\n' => "\\n",
                '\r' => "\\r",
                '\t' => "\\t",
                _ when char.IsControl(c) => $"\\u{(int)c:x4}",
                _ => c.ToString(),
            });
        }

        return builder.ToString();
    }
}

/// <summary>
/// A key Tern ignores, logged as a warning (Kind is the event: 104, 107, 108, 109); Reason is
/// what is said of it after the key, both on one line. Value is what the configuration holds there
/// (every key and value under it, for a section), so that a reload names it again once it changes.
/// </summary>
public sealed record UnreadSetting(string Key, UnreadSetting.Kinds Kind, string Reason, string? Value = null)
{
    private readonly string _key = ConfigurationProblem.OneLine(Key);
    private readonly string _reason = ConfigurationProblem.OneLine(Reason);

    public string Key { get => _key; init => _key = ConfigurationProblem.OneLine(value); }

    public string Reason { get => _reason; init => _reason = ConfigurationProblem.OneLine(value); }

    public enum Kinds
    {
        /// <summary>Under Tern: no setting of Tern's.</summary>
        NotTern,

        /// <summary>Under Kestrel, outside Kestrel:Limits.</summary>
        NotKestrelLimit,

        /// <summary>Under ReverseProxy: not read by YARP.</summary>
        NotYarp,

        /// <summary>A section given a value of its own (Tern__Https=5 beside Tern:Https:Port).</summary>
        GivenToSection,
    }

    /// <summary>A key under Tern or Kestrel that no reader asked for.</summary>
    public static UnreadSetting Unknown(string key, bool section) => section
        ? new(key, Kinds.GivenToSection, $"is a section, not a setting: the value given to it is ignored; {SettingsUnder(key)}")
        : key.Split(':')[0].Equals("Kestrel", StringComparison.OrdinalIgnoreCase)
            ? new(key, Kinds.NotKestrelLimit, "is ignored: of the Kestrel section Tern reads only Kestrel:Limits; its listeners are set by Tern:Https:Port, Tern:Http:Port and Tern:Management:Port, their certificates by Tern:Tls:Certificates")
            : new(key, Kinds.NotTern, "is not a Tern setting and is ignored (misspelt?)");

    /// <summary>What to give in place of a value given to a section.</summary>
    public static string SettingsUnder(string key) => $"give the settings under it ({key}:...; environment: {Environment(key)}__...)";

    /// <summary>The environment variable's name for a key.</summary>
    public static string Environment(string key) => key.Replace(":", "__", StringComparison.Ordinal);
}
