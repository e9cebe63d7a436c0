namespace Tern.Proxy.Configuration;

/// <summary>One thing wrong with the configuration, named by the key that caused it.</summary>
public sealed record ConfigurationProblem(string Key, string Message)
{
    public override string ToString() => $"{Key}: {Message}";
}
