if __name__ == "resources":  # imported by its checkout name: hand out the installed package's modules
    from rota.resources.checkout_names import answer_to_checkout_names

    answer_to_checkout_names(__name__)
